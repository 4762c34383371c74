import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """PReLU -> MultiheadAttention."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.prelu = nn.PReLU()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        x = self.prelu(x)
        x = self.attn(x, x, x, need_weights=False)[0]
        return x


batch_size = 64
in_channels = 32
length = 8192
embed_dim = 8192
num_heads = 8


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [embed_dim, num_heads]
