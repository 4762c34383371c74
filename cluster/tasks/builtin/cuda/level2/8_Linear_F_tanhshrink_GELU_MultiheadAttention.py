import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear -> F_tanhshrink -> GELU -> MultiheadAttention."""

    def __init__(self, in_features, out_features, embed_dim, num_heads):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.gelu = nn.GELU()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        x = self.linear(x)
        x = F.tanhshrink(x)
        x = self.gelu(x)
        x = self.attn(x, x, x, need_weights=False)[0]
        return x


batch_size = 64
in_channels = 128
length = 4096
in_features = 4096
out_features = 768
embed_dim = 768
num_heads = 8


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_features, out_features, embed_dim, num_heads]
