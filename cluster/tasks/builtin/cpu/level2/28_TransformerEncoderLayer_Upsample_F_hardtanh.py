import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """TransformerEncoderLayer -> Upsample -> F_hardtanh."""

    def __init__(self, d_model, nhead, dim_feedforward, scale_factor):
        super().__init__()
        self.encoder_layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=0.0, batch_first=True)
        self.upsample = nn.Upsample(scale_factor=scale_factor, mode='nearest')

    def forward(self, x):
        x = self.encoder_layer(x)
        x = self.upsample(x)
        x = F.hardtanh(x)
        return x


batch_size = 16
seq_len = 64
hidden_size = 96
d_model = 96
nhead = 8
dim_feedforward = 192
scale_factor = 2


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [d_model, nhead, dim_feedforward, scale_factor]
