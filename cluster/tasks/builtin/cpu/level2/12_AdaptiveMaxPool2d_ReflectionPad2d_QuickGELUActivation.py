import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import QuickGELUActivation


class Model(nn.Module):
    """AdaptiveMaxPool2d -> ReflectionPad2d -> QuickGELUActivation."""

    def __init__(self, output_size, pad):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool2d(output_size)
        self.pad = nn.ReflectionPad2d(pad)
        self.quickgeluactivation = QuickGELUActivation()

    def forward(self, x):
        x = self.pool(x)
        x = self.pad(x)
        x = self.quickgeluactivation(x)
        return x


batch_size = 32
in_channels = 16
height = 16
width = 16
output_size = 2
pad = 1


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [output_size, pad]
