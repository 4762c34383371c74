import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """Sigmoid through one custom CUDA kernel; output allocated with empty_like."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        ops.sigmoid_f32(x, y, x.numel())
        return y
