import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """BatchedMatmul -> AdaptiveMaxPool1d -> AddConst."""

    def __init__(self, output_size, add_value):
        super().__init__()
        self.pool = nn.AdaptiveMaxPool1d(output_size)
        self.add_value = add_value

    def forward(self, x, y):
        x = torch.bmm(x, y)
        x = self.pool(x)
        x = x + self.add_value
        return x


batch_size = 16
m = 128
k = 64
n = 192
output_size = 4
add_value = 1.0


def get_inputs():
    return [torch.randn(batch_size, m, k), torch.randn(batch_size, k, n)]


def get_init_inputs():
    return [output_size, add_value]
