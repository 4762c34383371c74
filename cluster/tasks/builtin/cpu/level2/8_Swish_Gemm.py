import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Swish -> Gemm."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = x * torch.sigmoid(x)
        x = self.linear(x)
        return x


batch_size = 8
in_features = 512
out_features = 2048


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
