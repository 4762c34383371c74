import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """BatchedMatmul -> GELU."""

    def __init__(self):
        super().__init__()
        self.gelu = nn.GELU()

    def forward(self, x, y):
        x = torch.bmm(x, y)
        x = self.gelu(x)
        return x


batch_size = 32
m = 1024
k = 1024
n = 512


def get_inputs():
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n)]


def get_init_inputs():
    return []
