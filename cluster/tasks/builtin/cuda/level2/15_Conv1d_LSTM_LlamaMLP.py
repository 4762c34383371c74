import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP


class Model(nn.Module):
    """Conv1d -> LSTM -> LlamaMLP."""

    def __init__(self, in_channels, out_channels, kernel_size, input_size, hidden_size, intermediate_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)
        self.mlp = LlamaMLP(LlamaConfig(hidden_size=hidden_size, intermediate_size=intermediate_size, hidden_act='silu'))

    def forward(self, x):
        x = self.conv(x)
        x = self.lstm(x)[0]
        x = self.mlp(x)
        return x


batch_size = 64
in_channels = 64
length = 2048
out_channels = 128
kernel_size = 3
input_size = 2046
hidden_size = 512
intermediate_size = 1024


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, input_size, hidden_size, intermediate_size]
