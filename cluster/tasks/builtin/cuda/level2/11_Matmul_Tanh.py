import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Matmul -> Tanh."""

    def __init__(self):
        super().__init__()
        self.tanh = nn.Tanh()

    def forward(self, x, y):
        x = torch.matmul(x, y)
        x = self.tanh(x)
        return x


M = 4096
K = 4096
N = 1024


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
