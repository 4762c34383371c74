import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv3d -> AvgPool3d -> Divide -> GroupNorm."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, pool_kernel_size, divisor, num_groups, num_channels):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=padding)
        self.pool = nn.AvgPool3d(kernel_size=pool_kernel_size)
        self.divisor = divisor
        self.group_norm = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x):
        x = self.conv(x)
        x = self.pool(x)
        x = x / self.divisor
        x = self.group_norm(x)
        return x


batch_size = 8
in_channels = 12
depth = 12
height = 12
width = 12
out_channels = 8
kernel_size = 3
padding = 1
pool_kernel_size = 3
divisor = 4.0
num_groups = 4
num_channels = 8


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding, pool_kernel_size, divisor, num_groups, num_channels]
