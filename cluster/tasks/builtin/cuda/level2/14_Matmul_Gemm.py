import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Matmul -> Gemm."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x, y):
        x = torch.matmul(x, y)
        x = self.linear(x)
        return x


M = 3072
K = 1024
N = 2048
in_features = 2048
out_features = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return [in_features, out_features]
