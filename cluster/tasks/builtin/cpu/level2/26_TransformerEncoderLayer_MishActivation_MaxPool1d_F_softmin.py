import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import MishActivation


class Model(nn.Module):
    """TransformerEncoderLayer -> MishActivation -> MaxPool1d -> F_softmin."""

    def __init__(self, d_model, nhead, dim_feedforward, pool_kernel_size):
        super().__init__()
        self.encoder_layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=0.0, batch_first=True)
        self.mishactivation = MishActivation()
        self.pool = nn.MaxPool1d(kernel_size=pool_kernel_size)

    def forward(self, x):
        x = self.encoder_layer(x)
        x = self.mishactivation(x)
        x = self.pool(x)
        x = F.softmin(x, dim=1)
        return x


batch_size = 16
seq_len = 64
hidden_size = 64
d_model = 64
nhead = 8
dim_feedforward = 128
pool_kernel_size = 2


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [d_model, nhead, dim_feedforward, pool_kernel_size]
