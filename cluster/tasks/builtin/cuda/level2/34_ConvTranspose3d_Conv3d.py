import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose3d -> Conv3d."""

    def __init__(self, in_channels, out_channels, kernel_size, in_channels_2, out_channels_2):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size)
        self.conv = nn.Conv3d(in_channels_2, out_channels_2, kernel_size)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.conv(x)
        return x


batch_size = 32
in_channels = 64
depth = 32
height = 32
width = 32
out_channels = 32
kernel_size = 3
in_channels_2 = 32
out_channels_2 = 128


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, in_channels_2, out_channels_2]
