import math

import torch
import torch.nn as nn

import krl

ops = krl.ops()

PARTS = 256  # blocks per row in the statistics pass


class ModelNew(nn.Module):
    """nn.LayerNorm over the trailing `normalized_shape` dims: three small CUDA kernels (partials, stats, apply).

    Keeps `self.ln = nn.LayerNorm(...)` so Model's state_dict (ln.weight, ln.bias) loads unchanged.
    """

    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        d = math.prod(self.ln.normalized_shape)
        rows = x.numel() // d
        partial = torch.empty(rows * PARTS * 2, dtype=torch.float64, device=x.device)
        stats = torch.empty(rows * 2, dtype=torch.float32, device=x.device)
        y = torch.empty_like(x)
        ops.layernorm_f32(x, self.ln.weight, self.ln.bias, partial, PARTS, stats, y, rows, d, float(self.ln.eps))
        return y
