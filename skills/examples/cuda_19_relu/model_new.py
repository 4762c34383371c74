import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """ReLU through a custom CUDA kernel (float4, grid-stride); output allocated with empty_like."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        ops.relu_f32(x, y, x.numel())
        return y
