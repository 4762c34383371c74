import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose2d -> AvgPool2d."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, pool_kernel_size):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride)
        self.pool = nn.AvgPool2d(kernel_size=pool_kernel_size)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.pool(x)
        return x


batch_size = 16
in_channels = 8
height = 32
width = 32
out_channels = 8
kernel_size = 3
stride = 2
pool_kernel_size = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, pool_kernel_size]
