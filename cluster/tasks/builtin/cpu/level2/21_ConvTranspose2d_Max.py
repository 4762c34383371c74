import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose2d -> Max."""

    def __init__(self, in_channels, out_channels, kernel_size, reduce_dim):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size)
        self.reduce_dim = reduce_dim

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.amax(x, dim=self.reduce_dim, keepdim=True)
        return x


batch_size = 32
in_channels = 12
height = 16
width = 16
out_channels = 32
kernel_size = 4
reduce_dim = -1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, reduce_dim]
