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
