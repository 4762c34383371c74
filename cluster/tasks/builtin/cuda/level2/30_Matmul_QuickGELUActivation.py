import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import QuickGELUActivation


class Model(nn.Module):
    """Matmul -> QuickGELUActivation."""

    def __init__(self):
        super().__init__()
        self.quickgeluactivation = QuickGELUActivation()

    def forward(self, x, y):
        x = torch.matmul(x, y)
        x = self.quickgeluactivation(x)
        return x


M = 2048
K = 3072
N = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
