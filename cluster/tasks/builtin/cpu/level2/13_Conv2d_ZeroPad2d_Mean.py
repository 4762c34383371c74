import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv2d -> ZeroPad2d -> Mean."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, pad, reduce_dim):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding)
        self.pad = nn.ZeroPad2d(pad)
        self.reduce_dim = reduce_dim

    def forward(self, x):
        x = self.conv(x)
        x = self.pad(x)
        x = torch.mean(x, dim=self.reduce_dim, keepdim=True)
        return x


batch_size = 16
in_channels = 8
height = 16
width = 16
out_channels = 16
kernel_size = 3
padding = 1
pad = 1
reduce_dim = -1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding, pad, reduce_dim]
