import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv3d -> Swish -> AddConst -> Hardshrink."""

    def __init__(self, in_channels, out_channels, kernel_size, add_value):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.add_value = add_value
        self.hardshrink = nn.Hardshrink()

    def forward(self, x):
        x = self.conv(x)
        x = x * torch.sigmoid(x)
        x = x + self.add_value
        x = self.hardshrink(x)
        return x


batch_size = 16
in_channels = 12
depth = 8
height = 8
width = 8
out_channels = 4
kernel_size = 3
add_value = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, add_value]
