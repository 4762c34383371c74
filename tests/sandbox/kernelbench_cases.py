"""KernelBench-style solutions (model_new.py building its kernels with load_inline) for the format tests."""
from __future__ import annotations

RELU_KB = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_cpp_source = """
torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* a = xc.data_ptr<float>();
    float* b = y.data_ptr<float>();
    const int64_t n = xc.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) b[i] = a[i] > 0.f ? a[i] : 0.f;
    return y;
}
"""

relu_ext = load_inline(
    name="relu_ext",
    cpp_sources=relu_cpp_source,
    functions=["relu_forward"],
    verbose=False,
    extra_cflags=[""],
    extra_ldflags=[""],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = relu_ext

    def forward(self, x):
        return self.relu.relu_forward(x)
'''

GEMM_KB = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

GEMM_SRC = """
torch::Tensor gemm_mul_lrelu(torch::Tensor x, torch::Tensor w, torch::Tensor b, double mult, double slope) {
    auto xc = x.contiguous();
    auto wc = w.contiguous();
    const int64_t M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto y = torch::empty({M, N}, xc.options());
    const float* X = xc.data_ptr<float>();
    const float* W = wc.data_ptr<float>();
    const float* B = b.data_ptr<float>();
    float* Y = y.data_ptr<float>();
    #pragma omp parallel for
    for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
            float acc = B[j];
            for (int64_t k = 0; k < K; ++k) acc += X[i * K + k] * W[j * K + k];
            acc *= (float)mult;
            Y[i * N + j] = acc > 0.f ? acc : acc * (float)slope;
        }
    }
    return y;
}
"""
GEMM_DECL = "torch::Tensor gemm_mul_lrelu(torch::Tensor x, torch::Tensor w, torch::Tensor b, double mult, double slope);"

fused = load_inline(name="gemm_fused", cpp_sources=[GEMM_SRC], functions=["gemm_mul_lrelu"])


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x):
        return fused.gemm_mul_lrelu(x, self.gemm.weight, self.gemm.bias, self.multiplier, self.negative_slope)
'''

MATMUL_KB = RELU_KB.replace("auto y = torch::empty_like(xc);", "auto y = torch::matmul(xc, xc.t());")

COMPUTED_KB = RELU_KB.replace("cpp_sources=relu_cpp_source,", "cpp_sources=relu_cpp_source.replace('0.f', '0.0f'),")

# KernelBench's own CUDA example shape: a __global__ kernel in cuda_sources, the C++ declaration in cpp_sources.
RELU_KB_CUDA = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_source = """
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const int64_t n = xc.numel();
    const int block = 256;
    const int64_t grid = (n + block - 1) / block;
    relu_kernel<<<(unsigned)grid, block>>>(xc.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

relu_cpp_source = "torch::Tensor relu_cuda(torch::Tensor x);"

relu = load_inline(
    name="relu_cuda_ext",
    cpp_sources=relu_cpp_source,
    cuda_sources=relu_source,
    functions=["relu_cuda"],
    verbose=False,
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = relu

    def forward(self, x):
        return self.relu.relu_cuda(x)
'''

# CUDA-Agent's workspace: an extern "C" launcher in kernels/*.cu, a torch-typed wrapper registered with
# binding_registry.h in kernels/*_binding.cpp, model_new.py importing the built `cuda_extension`.
RELU_CUDA_AGENT = {
    "kernels/relu.cu": r'''
#include <cstdint>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = x[i] > 0.f ? x[i] : 0.f;
}

extern "C" void relu_launch(const float* x, float* y, int64_t n, cudaStream_t stream) {
    const int block = 256;
    int64_t grid = (n + block - 1) / block;
    if (grid > 65535) grid = 65535;
    relu_kernel<<<(unsigned)grid, block, 0, stream>>>(x, y, n);
}
''',
    "kernels/relu_binding.cpp": r'''
#include "binding_registry.h"
#include <c10/cuda/CUDAStream.h>

extern "C" void relu_launch(const float* x, float* y, int64_t n, cudaStream_t stream);

static torch::Tensor relu_forward(torch::Tensor x) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    relu_launch(xc.data_ptr<float>(), y.data_ptr<float>(), xc.numel(), c10::cuda::getCurrentCUDAStream());
    return y;
}

REGISTER_BINDING(relu) { m.def("relu_forward", &relu_forward); }
''',
    "model_new.py": '''
import torch
import torch.nn as nn

import cuda_extension


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return cuda_extension.relu_forward(x)
''',
}
