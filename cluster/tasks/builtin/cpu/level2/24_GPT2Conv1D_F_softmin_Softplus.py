import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.pytorch_utils import Conv1D


class Model(nn.Module):
    """GPT2Conv1D -> F_softmin -> Softplus."""

    def __init__(self, nf, nx):
        super().__init__()
        self.conv1d = Conv1D(nf, nx)
        self.softplus = nn.Softplus()

    def forward(self, x):
        x = self.conv1d(x)
        x = F.softmin(x, dim=1)
        x = self.softplus(x)
        return x


batch_size = 16
seq_len = 16
hidden_size = 96
nf = 128
nx = 96


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [nf, nx]
