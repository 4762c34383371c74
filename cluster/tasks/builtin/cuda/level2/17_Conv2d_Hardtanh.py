import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv2d -> Hardtanh."""

    def __init__(self, in_channels, out_channels, kernel_size, padding):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding)
        self.hardtanh = nn.Hardtanh()

    def forward(self, x):
        x = self.conv(x)
        x = self.hardtanh(x)
        return x


batch_size = 128
in_channels = 128
height = 128
width = 128
out_channels = 128
kernel_size = 3
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding]
