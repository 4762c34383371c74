import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose1d -> Softmax."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose1d(in_channels, out_channels, kernel_size)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.softmax(x)
        return x


batch_size = 16
in_channels = 12
length = 384
out_channels = 8
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
