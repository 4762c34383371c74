import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import GELUActivation


class Model(nn.Module):
    """Conv2d -> GELUActivation_gelu_python."""

    def __init__(self, in_channels, out_channels, kernel_size, padding):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding)
        self.geluactivation_gelu_python = GELUActivation(use_gelu_python=True)

    def forward(self, x):
        x = self.conv(x)
        x = self.geluactivation_gelu_python(x)
        return x


batch_size = 32
in_channels = 4
height = 32
width = 32
out_channels = 24
kernel_size = 3
padding = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, padding]
