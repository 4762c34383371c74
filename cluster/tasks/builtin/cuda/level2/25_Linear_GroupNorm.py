import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear -> GroupNorm."""

    def __init__(self, in_features, out_features, num_groups, num_channels):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.group_norm = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x):
        x = self.linear(x)
        x = self.group_norm(x)
        return x


batch_size = 64
in_channels = 64
length = 4096
in_features = 4096
out_features = 1024
num_groups = 8
num_channels = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_features, out_features, num_groups, num_channels]
