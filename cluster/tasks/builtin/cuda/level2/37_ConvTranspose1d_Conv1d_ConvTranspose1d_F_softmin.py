import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose1d -> Conv1d -> ConvTranspose1d -> F_softmin."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, in_channels_2, out_channels_2, stride):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, padding=padding)
        self.conv = nn.Conv1d(in_channels_2, out_channels, kernel_size, padding=padding)
        self.conv_transpose2 = nn.ConvTranspose1d(in_channels_2, out_channels_2, kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.conv(x)
        x = self.conv_transpose2(x)
        x = F.softmin(x, dim=1)
        return x


batch_size = 64
in_channels = 32
length = 4096
out_channels = 64
kernel_size = 3
padding = 1
in_channels_2 = 64
out_channels_2 = 128
stride = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding, in_channels_2, out_channels_2, stride]
