import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.pytorch_utils import Conv1D


class Model(nn.Module):
    """GPT2Conv1D -> AddConst -> Upsample."""

    def __init__(self, nf, nx, add_value, scale_factor):
        super().__init__()
        self.conv1d = Conv1D(nf, nx)
        self.add_value = add_value
        self.upsample = nn.Upsample(scale_factor=scale_factor, mode='nearest')

    def forward(self, x):
        x = self.conv1d(x)
        x = x + self.add_value
        x = self.upsample(x)
        return x


batch_size = 128
seq_len = 512
hidden_size = 1024
nf = 512
nx = 1024
add_value = 0.5
scale_factor = 2


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [nf, nx, add_value, scale_factor]
