import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Matmul -> Gemm -> F_elu -> LogSoftmax -> Gemm."""

    def __init__(self, in_features, out_features, in_features_2):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.logsoftmax = nn.LogSoftmax(dim=1)
        self.linear2 = nn.Linear(in_features_2, out_features)

    def forward(self, x, y):
        x = torch.matmul(x, y)
        x = self.linear(x)
        x = F.elu(x)
        x = self.logsoftmax(x)
        x = self.linear2(x)
        return x


M = 2048
K = 1024
N = 3072
in_features = 3072
out_features = 4096
in_features_2 = 4096


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return [in_features, out_features, in_features_2]
