import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import GELUTanh


class Model(nn.Module):
    """MultiheadAttention -> GELUTanh_gelu_python_tanh."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.gelutanh_gelu_python_tanh = GELUTanh(use_gelu_tanh_python=True)

    def forward(self, x):
        x = self.attn(x, x, x, need_weights=False)[0]
        x = self.gelutanh_gelu_python_tanh(x)
        return x


batch_size = 64
seq_len = 256
hidden_size = 512
embed_dim = 512
num_heads = 8


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [embed_dim, num_heads]
