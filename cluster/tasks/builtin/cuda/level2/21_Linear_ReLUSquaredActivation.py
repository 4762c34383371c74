import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import ReLUSquaredActivation


class Model(nn.Module):
    """Linear -> ReLUSquaredActivation."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.relusquaredactivation = ReLUSquaredActivation()

    def forward(self, x):
        x = self.linear(x)
        x = self.relusquaredactivation(x)
        return x


batch_size = 128
in_channels = 64
length = 2048
in_features = 2048
out_features = 1024


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_features, out_features]
