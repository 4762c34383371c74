import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """torch.mean((predictions - targets) ** 2) as one fused OpenMP reduction; returns a 0-dim tensor."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        predictions = predictions.contiguous()
        targets = targets.contiguous()
        out = torch.empty((), dtype=predictions.dtype, device=predictions.device)
        ops.mse_f32(predictions, targets, out, predictions.numel())
        return out
