import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ReflectionPad2d -> MaxPool2d."""

    def __init__(self, pad, pool_kernel_size):
        super().__init__()
        self.pad = nn.ReflectionPad2d(pad)
        self.pool = nn.MaxPool2d(kernel_size=pool_kernel_size)

    def forward(self, x):
        x = self.pad(x)
        x = self.pool(x)
        return x


batch_size = 16
in_channels = 16
height = 32
width = 32
pad = 1
pool_kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [pad, pool_kernel_size]
