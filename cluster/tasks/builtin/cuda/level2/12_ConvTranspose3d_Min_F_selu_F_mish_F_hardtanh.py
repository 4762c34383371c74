import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """ConvTranspose3d -> Min -> F_selu -> F_mish -> F_hardtanh."""

    def __init__(self, in_channels, out_channels, kernel_size, padding, reduce_dim):
        super().__init__()
        self.conv_transpose = nn.ConvTranspose3d(in_channels, out_channels, kernel_size, padding=padding)
        self.reduce_dim = reduce_dim

    def forward(self, x):
        x = self.conv_transpose(x)
        x = torch.amin(x, dim=self.reduce_dim, keepdim=True)
        x = F.selu(x)
        x = F.mish(x)
        x = F.hardtanh(x)
        return x


batch_size = 64
in_channels = 64
depth = 24
height = 24
width = 24
out_channels = 64
kernel_size = 3
padding = 1
reduce_dim = -1


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding, reduce_dim]
