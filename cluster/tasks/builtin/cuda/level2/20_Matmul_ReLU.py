import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Matmul -> ReLU."""

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()

    def forward(self, x, y):
        x = torch.matmul(x, y)
        x = self.relu(x)
        return x


M = 4096
K = 2048
N = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
