import torch
import torch.nn as nn
import krl

ops = krl.ops()


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        ops.leaky_relu_f32(x, y, x.numel())
        return y
