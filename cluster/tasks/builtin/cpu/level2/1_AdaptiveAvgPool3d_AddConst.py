import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """AdaptiveAvgPool3d -> AddConst."""

    def __init__(self, output_size, add_value):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool3d(output_size)
        self.add_value = add_value

    def forward(self, x):
        x = self.pool(x)
        x = x + self.add_value
        return x


batch_size = 32
in_channels = 16
depth = 6
height = 6
width = 6
output_size = 2
add_value = 1.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [output_size, add_value]
