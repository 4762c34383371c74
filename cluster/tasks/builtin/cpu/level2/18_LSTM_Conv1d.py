import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """LSTM -> Conv1d."""

    def __init__(self, input_size, hidden_size_2, in_channels, out_channels, kernel_size):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size_2, batch_first=True)
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.lstm(x)[0]
        x = self.conv(x)
        return x


batch_size = 16
seq_len = 64
hidden_size = 64
input_size = 64
hidden_size_2 = 96
in_channels = 64
out_channels = 8
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size_2, in_channels, out_channels, kernel_size]
