import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """Softmax over dim 1 of a 2-D tensor: one CUDA block per row (online max/sum, then one write pass)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        ops.softmax_rows(x, y, rows, cols)
        return y
