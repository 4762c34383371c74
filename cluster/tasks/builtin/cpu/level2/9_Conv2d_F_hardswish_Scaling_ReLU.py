import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv2d -> F_hardswish -> Scaling -> ReLU."""

    def __init__(self, in_channels, out_channels, kernel_size, scaling_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scaling_factor = scaling_factor
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.conv(x)
        x = F.hardswish(x)
        x = x * self.scaling_factor
        x = self.relu(x)
        return x


batch_size = 16
in_channels = 4
height = 32
width = 32
out_channels = 8
kernel_size = 3
scaling_factor = 2.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scaling_factor]
