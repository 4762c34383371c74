import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose1d -> MaxPool1d -> Flatten."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, pool_kernel_size):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.pool = nn.MaxPool1d(kernel_size=pool_kernel_size)
        self.flatten = nn.Flatten()

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.pool(x)
        x = self.flatten(x)
        return x


batch_size = 16
in_channels = 8
length = 512
out_channels = 12
kernel_size = 3
stride = 2
pool_kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, pool_kernel_size]
