import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """Gemm + multiply + LeakyReLU as one fused kernel.

    Keeps `self.gemm = nn.Linear(...)` so that Model's state_dict (gemm.weight, gemm.bias)
    loads into ModelNew unchanged; forward only allocates the output and calls the kernel.
    """

    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = float(multiplier)
        self.negative_slope = float(negative_slope)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        batch, k = x.shape
        n = self.gemm.weight.shape[0]
        y = torch.empty(batch, n, dtype=x.dtype, device=x.device)
        ops.gemm_mul_lrelu(x, self.gemm.weight, self.gemm.bias, y, batch, k, n, self.multiplier,
                           self.negative_slope)
        return y
