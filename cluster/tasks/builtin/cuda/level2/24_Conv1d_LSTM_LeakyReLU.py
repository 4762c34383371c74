import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv1d -> LSTM -> LeakyReLU."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, input_size, hidden_size):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=padding)
        self.lstm = nn.LSTM(input_size, hidden_size, batch_first=True)
        self.leakyrelu = nn.LeakyReLU()

    def forward(self, x):
        x = self.conv(x)
        x = self.lstm(x)[0]
        x = self.leakyrelu(x)
        return x


batch_size = 128
in_channels = 32
length = 8192
out_channels = 32
kernel_size = 3
padding = 1
input_size = 8192
hidden_size = 1024


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding, input_size, hidden_size]
