import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """C = A @ B with a shared-memory tiled CUDA SGEMM (64x64 tiles, 4x4 register blocking)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        A = A.contiguous()
        B = B.contiguous()
        m, k = A.shape
        n = B.shape[1]
        C = torch.empty(m, n, dtype=A.dtype, device=A.device)
        ops.matmul_f32(A, B, C, m, k, n)
        return C
