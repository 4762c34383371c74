"""CUDA versions of the ReLU solution and of the kernel-side hacks (built by nvcc in CI, run on GPU)."""
from __future__ import annotations

from tests.sandbox.helpers import RELU_PY


def relu_cu(body: str, extra: str = "", includes: str = "") -> dict[str, str]:
    """A .cu ReLU whose __global__ body is `body` (x, y, n, i in scope); launcher on the given stream."""
    cu = f'''
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"
{includes}
{extra}
__global__ void relu_kernel(const float* x, float* y, int64_t n) {{
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
{body}
}}
extern "C" void relu_f32(const float* x, float* y, int64_t n, cudaStream_t stream) {{
  relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);
}}
KRL_OP(relu_f32, "const f32* x, f32* y, i64 n, stream")
'''
    return {"model_new.py": RELU_PY, "kernels/relu.cu": cu}


HONEST = relu_cu("  if (i < n) y[i] = fmaxf(x[i], 0.f);")
WRONG = relu_cu("  if (i < n) y[i] = 2.f * x[i];")
INPUT_MUTATION = relu_cu("  if (i < n) { y[i] = fmaxf(x[i], 0.f); ((float*)x)[i] = 0.f; }")
ILLEGAL_ADDRESS = relu_cu("  if (i < n) { float* p = nullptr; p[i * 1024] = x[i]; y[i] = x[i]; }")
HANG = relu_cu("  volatile int spin = 1; while (spin) { }")
# replays a saved result when called again with the same input pointer
CACHING = relu_cu("  if (i < n) y[i] = fmaxf(x[i], 0.f);", extra="static const float* g_last = nullptr;")
SIDE_STREAM = relu_cu("  if (i < n) y[i] = fmaxf(x[i], 0.f);",
                      extra="static void side() { cudaStream_t s; cudaStreamCreate(&s); }")

COMPILABLE = {"honest": HONEST, "wrong": WRONG, "input_mutation": INPUT_MUTATION,
              "illegal_address": ILLEGAL_ADDRESS, "hang": HANG}
