import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose2d -> ELU -> LogSumExp."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, reduce_dim):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, padding=padding)
        self.elu = nn.ELU()
        self.reduce_dim = reduce_dim

    def forward(self, x):
        x = self.conv_transpose(x)
        x = self.elu(x)
        x = torch.logsumexp(x, dim=self.reduce_dim, keepdim=True)
        return x


batch_size = 16
in_channels = 4
height = 32
width = 32
out_channels = 16
kernel_size = 3
padding = 1
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding, reduce_dim]
