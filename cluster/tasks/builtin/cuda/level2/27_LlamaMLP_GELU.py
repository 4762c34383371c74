import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP


class Model(nn.Module):
    """LlamaMLP -> GELU."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.mlp = LlamaMLP(LlamaConfig(hidden_size=hidden_size, intermediate_size=intermediate_size, hidden_act='silu'))
        self.gelu = nn.GELU()

    def forward(self, x):
        x = self.mlp(x)
        x = self.gelu(x)
        return x


batch_size = 32
seq_len = 256
hidden_size = 1024
intermediate_size = 2048


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [hidden_size, intermediate_size]
