import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import FastGELUActivation


class Model(nn.Module):
    """F_leaky_relu -> FastGELUActivation."""

    def __init__(self):
        super().__init__()
        self.fastgeluactivation = FastGELUActivation()

    def forward(self, x):
        x = F.leaky_relu(x)
        x = self.fastgeluactivation(x)
        return x


batch_size = 64
in_channels = 128
depth = 32
height = 32
width = 32


def get_inputs():
    return [torch.randn(batch_size, in_channels, depth, height, width)]


def get_init_inputs():
    return []
