import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """Exact (erf) GELU, as F.gelu default, through a custom OpenMP+SIMD kernel.

    forward only allocates the output (empty_like) and calls the kernel.
    """

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        ops.gelu_f32(x, y, x.numel())
        return y
