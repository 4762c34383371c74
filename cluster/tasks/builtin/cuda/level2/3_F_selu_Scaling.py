import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F_selu -> Scaling."""

    def __init__(self, scaling_factor):
        super().__init__()
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = F.selu(x)
        x = x * self.scaling_factor
        return x


batch_size = 128
in_channels = 64
depth = 32
height = 32
width = 32
scaling_factor = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [scaling_factor]
