import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Conv1d -> BatchNorm1d -> F_normalize -> F_silu."""

    def __init__(self, in_channels, out_channels, kernel_size, num_features):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm1d(num_features)

    def forward(self, x):
        x = self.conv(x)
        x = self.bn(x)
        x = F.normalize(x)
        x = F.silu(x)
        return x


batch_size = 64
in_channels = 32
length = 16384
out_channels = 64
kernel_size = 5
num_features = 64


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_features]
