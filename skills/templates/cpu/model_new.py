import torch
import torch.nn as nn

import krl

ops = krl.ops()  # one callable per KRL_OP in kernels/


class ModelNew(nn.Module):
    """TODO: same constructor arguments (and submodule names) as Model in model.py."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)  # allocate the output; the kernel fills it
        ops.my_kernel(x, y, x.numel())
        return y
