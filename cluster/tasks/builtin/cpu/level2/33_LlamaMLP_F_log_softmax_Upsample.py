import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP


class Model(nn.Module):
    """LlamaMLP -> F_log_softmax -> Upsample."""

    def __init__(self, hidden_size, intermediate_size, scale_factor):
        super().__init__()
        self.mlp = LlamaMLP(LlamaConfig(hidden_size=hidden_size, intermediate_size=intermediate_size, hidden_act='silu'))
        self.upsample = nn.Upsample(scale_factor=scale_factor, mode='nearest')

    def forward(self, x):
        x = self.mlp(x)
        x = F.log_softmax(x, dim=1)
        x = self.upsample(x)
        return x


batch_size = 16
seq_len = 48
hidden_size = 64
intermediate_size = 128
scale_factor = 2


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [hidden_size, intermediate_size, scale_factor]
