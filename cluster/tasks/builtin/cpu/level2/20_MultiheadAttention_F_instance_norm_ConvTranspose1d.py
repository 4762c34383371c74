import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """MultiheadAttention -> F_instance_norm -> ConvTranspose1d."""

    def __init__(self, embed_dim, num_heads, in_channels, out_channels, kernel_size):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.conv_transpose = nn.ConvTranspose1d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.attn(x, x, x, need_weights=False)[0]
        x = F.instance_norm(x)
        x = self.conv_transpose(x)
        return x


batch_size = 8
seq_len = 64
hidden_size = 128
embed_dim = 128
num_heads = 8
in_channels = 64
out_channels = 12
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [embed_dim, num_heads, in_channels, out_channels, kernel_size]
