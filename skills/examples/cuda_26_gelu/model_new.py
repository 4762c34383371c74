import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """GELU (exact, erf form as F.gelu's default) through one custom CUDA kernel; output allocated with empty_like."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        ops.gelu_f32(x, y, x.numel())
        return y
