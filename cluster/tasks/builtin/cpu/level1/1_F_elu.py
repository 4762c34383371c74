import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """F_elu."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = F.elu(x)
        return x


batch_size = 16
in_channels = 8
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return []
