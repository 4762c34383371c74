import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """MultiheadAttention -> LeakyReLU -> Hardswish -> LeakyReLU."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.leakyrelu = nn.LeakyReLU()
        self.hardswish = nn.Hardswish()
        self.leakyrelu2 = nn.LeakyReLU()

    def forward(self, x):
        x = self.attn(x, x, x, need_weights=False)[0]
        x = self.leakyrelu(x)
        x = self.hardswish(x)
        x = self.leakyrelu2(x)
        return x


batch_size = 16
seq_len = 16
hidden_size = 192
embed_dim = 192
num_heads = 8


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [embed_dim, num_heads]
