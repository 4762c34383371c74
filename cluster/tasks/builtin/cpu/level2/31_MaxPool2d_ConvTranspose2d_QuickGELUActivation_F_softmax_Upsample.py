import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers.activations import QuickGELUActivation


class Model(nn.Module):
    """MaxPool2d -> ConvTranspose2d -> QuickGELUActivation -> F_softmax -> Upsample."""

    def __init__(self, pool_kernel_size, in_channels, out_channels, kernel_size, stride, padding, scale_factor):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=pool_kernel_size)
        self.conv_transpose = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.quickgeluactivation = QuickGELUActivation()
        self.upsample = nn.Upsample(scale_factor=scale_factor, mode='nearest')

    def forward(self, x):
        x = self.pool(x)
        x = self.conv_transpose(x)
        x = self.quickgeluactivation(x)
        x = F.softmax(x, dim=1)
        x = self.upsample(x)
        return x


batch_size = 8
in_channels = 12
height = 16
width = 16
pool_kernel_size = 3
out_channels = 32
kernel_size = 3
stride = 2
padding = 1
scale_factor = 2


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [pool_kernel_size, in_channels, out_channels, kernel_size, stride, padding, scale_factor]
