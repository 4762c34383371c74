import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose3d -> LogSigmoid."""

    def __init__(self, in_channels, out_channels, kernel_size, padding):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, padding=padding)
        self.logsigmoid = nn.LogSigmoid()

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.logsigmoid(x)
        return x


batch_size = 8
in_channels = 16
depth = 6
height = 6
width = 6
out_channels = 16
kernel_size = 3
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding]
