import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """MaxPool3d."""

    def __init__(self, pool_kernel_size):
        super().__init__()
        self.pool = nn.MaxPool3d(kernel_size=pool_kernel_size)

    def forward(self, x):
        x = self.pool(x)
        return x


batch_size = 8
in_channels = 12
depth = 12
height = 12
width = 12
pool_kernel_size = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [pool_kernel_size]
