import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """MultiheadAttention."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        x = self.attn(x, x, x, need_weights=False)[0]
        return x


batch_size = 64
seq_len = 1024
hidden_size = 512
embed_dim = 512
num_heads = 8


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [embed_dim, num_heads]
