import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Linear -> Tanhshrink."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.tanhshrink = nn.Tanhshrink()

    def forward(self, x):
        x = self.linear(x)
        x = self.tanhshrink(x)
        return x


batch_size = 128
in_channels = 64
length = 8192
in_features = 8192
out_features = 512


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_features, out_features]
