import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """TransformerEncoderLayer -> MultiheadAttention."""

    def __init__(self, d_model, nhead, dim_feedforward, embed_dim, num_heads):
        super().__init__()
        self.encoder_layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_feedforward, dropout=0.0, batch_first=True)
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        x = self.encoder_layer(x)
        x = self.attn(x, x, x, need_weights=False)[0]
        return x


batch_size = 32
seq_len = 1024
hidden_size = 768
d_model = 768
nhead = 8
dim_feedforward = 1536
embed_dim = 768
num_heads = 8


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [d_model, nhead, dim_feedforward, embed_dim, num_heads]
