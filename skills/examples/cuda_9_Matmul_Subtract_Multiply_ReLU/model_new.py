import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    """Linear, subtract, multiply and ReLU as one fused CUDA kernel (tiled GEMM with the epilogue in registers)."""

    def __init__(self, in_features, out_features, subtract_value, multiply_value):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.subtract_value = float(subtract_value)
        self.multiply_value = float(multiply_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        batch, k = x.shape
        n = self.linear.weight.shape[0]
        y = torch.empty(batch, n, dtype=x.dtype, device=x.device)
        ops.linear_sub_mul_relu(x, self.linear.weight, self.linear.bias, y, batch, k, n, self.subtract_value,
                                self.multiply_value)
        return y
