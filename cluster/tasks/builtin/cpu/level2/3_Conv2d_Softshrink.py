import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv2d -> Softshrink."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.softshrink = nn.Softshrink()

    def forward(self, x):
        x = self.conv(x)
        x = self.softshrink(x)
        return x


batch_size = 16
in_channels = 4
height = 24
width = 24
out_channels = 32
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
