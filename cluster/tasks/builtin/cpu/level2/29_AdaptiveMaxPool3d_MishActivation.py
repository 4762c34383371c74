import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import MishActivation


class Model(nn.Module):
    """AdaptiveMaxPool3d -> MishActivation."""

    def __init__(self, output_size):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool3d(output_size)
        self.mishactivation = MishActivation()

    def forward(self, x):
        x = self.pool(x)
        x = self.mishactivation(x)
        return x


batch_size = 16
in_channels = 8
depth = 12
height = 12
width = 12
output_size = 4


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [output_size]
