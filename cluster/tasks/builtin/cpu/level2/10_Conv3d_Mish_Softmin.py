import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv3d -> Mish -> Softmin."""

    def __init__(self, in_channels, out_channels, kernel_size, padding):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=padding)
        self.mish = nn.Mish()
        self.softmin = nn.Softmin(dim=1)

    def forward(self, x):
        x = self.conv(x)
        x = self.mish(x)
        x = self.softmin(x)
        return x


batch_size = 8
in_channels = 16
depth = 6
height = 6
width = 6
out_channels = 24
kernel_size = 3
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding]
