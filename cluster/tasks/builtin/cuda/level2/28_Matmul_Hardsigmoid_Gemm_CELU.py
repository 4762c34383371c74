import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Matmul -> Hardsigmoid -> Gemm -> CELU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.hardsigmoid = nn.Hardsigmoid()
        self.linear = nn.Linear(in_features, out_features)
        self.celu = nn.CELU()

    def forward(self, x, y):
        x = torch.matmul(x, y)
        x = self.hardsigmoid(x)
        x = self.linear(x)
        x = self.celu(x)
        return x


M = 3072
K = 3072
N = 4096
in_features = 4096
out_features = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return [in_features, out_features]
