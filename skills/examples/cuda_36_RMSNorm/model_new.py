import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """RMS normalisation over the feature dimension (dim 1) in one CUDA kernel."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        batch, feats = x.shape[0], x.shape[1]
        inner = x.numel() // (batch * feats)
        y = torch.empty_like(x)
        ops.rmsnorm_f32(x, y, batch, feats, inner, float(self.eps))
        return y
