import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """GRU -> GroupNorm."""

    def __init__(self, input_size, hidden_size_2, num_groups, num_channels):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden_size_2, batch_first=True)
        self.group_norm = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x):
        x = self.gru(x)[0]
        x = self.group_norm(x)
        return x


batch_size = 16
seq_len = 48
hidden_size = 64
input_size = 64
hidden_size_2 = 192
num_groups = 8
num_channels = 48


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size_2, num_groups, num_channels]
