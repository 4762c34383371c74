import torch
import torch.nn as nn

import krl

ops = krl.ops()

PARTS = 132 * 8  # blocks of the first pass (8 per H200 SM); each writes one partial sum


class ModelNew(nn.Module):
    """Mean squared error as two CUDA kernels: per-block partial sums, then one block adds them."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        p = predictions.contiguous()
        t = targets.contiguous()
        partial = torch.empty(PARTS, dtype=torch.float64, device=p.device)
        out = torch.empty((), dtype=p.dtype, device=p.device)
        ops.mse_f32(p, t, partial, PARTS, out, p.numel())
        return out
