import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import ClippedGELUActivation


class Model(nn.Module):
    """Gemm -> ClippedGELUActivation_gelu_10 -> PReLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.clippedgeluactivation_gelu_10 = ClippedGELUActivation(min=-10, max=10)
        self.prelu = nn.PReLU()

    def forward(self, x):
        x = self.linear(x)
        x = self.clippedgeluactivation_gelu_10(x)
        x = self.prelu(x)
        return x


batch_size = 8
in_features = 2048
out_features = 1024


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
