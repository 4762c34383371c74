import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv1d -> Divide."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, divisor):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=padding)
        self.divisor = divisor

    def forward(self, x):
        x = self.conv(x)
        x = x / self.divisor
        return x


batch_size = 64
in_channels = 64
length = 16384
out_channels = 256
kernel_size = 5
padding = 1
divisor = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding, divisor]
