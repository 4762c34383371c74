import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP


class Model(nn.Module):
    """LlamaMLP -> Flatten."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.mlp = LlamaMLP(LlamaConfig(hidden_size=hidden_size, intermediate_size=intermediate_size, hidden_act='silu'))
        self.flatten = nn.Flatten()

    def forward(self, x):
        x = self.mlp(x)
        x = self.flatten(x)
        return x


batch_size = 64
seq_len = 256
hidden_size = 512
intermediate_size = 1024


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [hidden_size, intermediate_size]
