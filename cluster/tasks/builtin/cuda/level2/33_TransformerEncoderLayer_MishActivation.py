import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import MishActivation


class Model(nn.Module):
    """TransformerEncoderLayer -> MishActivation."""

    def __init__(self, d_model, nhead, dim_feedforward):
        super().__init__()
        self.encoder_layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=0.0, batch_first=True)
        self.mishactivation = MishActivation()

    def forward(self, x):
        x = self.encoder_layer(x)
        x = self.mishactivation(x)
        return x


batch_size = 32
seq_len = 256
hidden_size = 1024
d_model = 1024
nhead = 8
dim_feedforward = 2048


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [d_model, nhead, dim_feedforward]
