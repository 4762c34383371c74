import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import ReLUSquaredActivation


class Model(nn.Module):
    """Mean -> Clamp -> ReLUSquaredActivation."""

    def __init__(self, reduce_dim, clamp_min, clamp_max):
        super().__init__()
        self.reduce_dim = reduce_dim
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max
        self.relusquaredactivation = ReLUSquaredActivation()

    def forward(self, x):
        x = torch.mean(x, dim=self.reduce_dim, keepdim=True)
        x = torch.clamp(x, min=self.clamp_min, max=self.clamp_max)
        x = self.relusquaredactivation(x)
        return x


batch_size = 32
in_channels = 12
depth = 10
height = 10
width = 10
reduce_dim = 1
clamp_min = -1.0
clamp_max = 1.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return [reduce_dim, clamp_min, clamp_max]
