import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """torch.softmax(x, dim=1) of a 2-D input through one OpenMP kernel (a row per task)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        ops.softmax_rows_f32(x, y, rows, cols)
        return y
