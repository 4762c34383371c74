import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import QuickGELUActivation


class Model(nn.Module):
    """BatchedMatmul -> Hardswish -> QuickGELUActivation."""

    def __init__(self):
        super().__init__()
        self.hardswish = nn.Hardswish()
        self.quickgeluactivation = QuickGELUActivation()

    def forward(self, x, y):
        x = torch.bmm(x, y)
        x = self.hardswish(x)
        x = self.quickgeluactivation(x)
        return x


batch_size = 64
m = 1024
k = 768
n = 1024


def get_inputs():
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n)]


def get_init_inputs():
    return []
