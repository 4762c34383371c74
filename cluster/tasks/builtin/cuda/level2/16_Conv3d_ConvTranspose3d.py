import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv3d -> ConvTranspose3d."""

    def __init__(self, in_channels, out_channels, kernel_size, in_channels_2):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size)
        self.conv_transpose = nn.ConvTranspose3d(in_channels_2, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv(x)
        x = self.conv_transpose(x)
        return x


batch_size = 64
in_channels = 128
depth = 16
height = 16
width = 16
out_channels = 64
kernel_size = 3
in_channels_2 = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, in_channels_2]
