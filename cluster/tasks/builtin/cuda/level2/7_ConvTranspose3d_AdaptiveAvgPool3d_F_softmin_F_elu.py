import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose3d -> AdaptiveAvgPool3d -> F_softmin -> F_elu."""

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, output_size):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.pool = nn.AdaptiveAvgPool3d(output_size)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.pool(x)
        x = F.softmin(x, dim=1)
        x = F.elu(x)
        return x


batch_size = 128
in_channels = 64
depth = 32
height = 32
width = 32
out_channels = 32
kernel_size = 3
stride = 2
padding = 1
output_size = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, output_size]
