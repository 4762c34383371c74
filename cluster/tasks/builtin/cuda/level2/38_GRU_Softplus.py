import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """GRU -> Softplus."""

    def __init__(self, input_size, hidden_size_2):
        super().__init__()
        self.gru = nn.GRU(input_size, hidden_size_2, batch_first=True)
        self.softplus = nn.Softplus()

    def forward(self, x):
        x = self.gru(x)[0]
        x = self.softplus(x)
        return x


batch_size = 32
seq_len = 512
hidden_size = 768
input_size = 768
hidden_size_2 = 1024


def get_inputs():
    return [torch.randn(batch_size, seq_len, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size_2]
