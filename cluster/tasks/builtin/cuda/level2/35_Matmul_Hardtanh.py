import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Matmul -> Hardtanh."""

    def __init__(self):
        super().__init__()
        self.hardtanh = nn.Hardtanh()

    def forward(self, x, y):
        x = torch.matmul(x, y)
        x = self.hardtanh(x)
        return x


M = 4096
K = 4096
N = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
