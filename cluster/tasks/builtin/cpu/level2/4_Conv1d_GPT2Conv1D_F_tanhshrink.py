import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.pytorch_utils import Conv1D


class Model(nn.Module):
    """Conv1d -> GPT2Conv1D -> F_tanhshrink."""

    def __init__(self, in_channels, out_channels, kernel_size, nf, nx):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size)
        self.conv1d = Conv1D(nf, nx)

    def forward(self, x):
        x = self.conv(x)
        x = self.conv1d(x)
        x = F.tanhshrink(x)
        return x


batch_size = 8
in_channels = 16
length = 384
out_channels = 12
kernel_size = 5
nf = 192
nx = 380


def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, nf, nx]
