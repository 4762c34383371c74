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
# A store 256 GB past the output (a null-pointer store is undefined behaviour that nvcc deletes; seen on the H200).
ILLEGAL_ADDRESS = relu_cu("  if (i < n) { y[i + ((int64_t)1 << 36)] = x[i]; y[i] = fmaxf(x[i], 0.f); }")
# Spins on a volatile global read that never changes (a side-effect-free loop is deleted by nvcc; seen on the H200).
HANG = relu_cu("  volatile const float* vx = x;\n  while (vx[0] == vx[0]) { }\n  if (i < n) y[i] = fmaxf(x[i], 0.f);")
# replays a saved result when called again with the same input pointer
CACHING = relu_cu("  if (i < n) y[i] = fmaxf(x[i], 0.f);", extra="static const float* g_last = nullptr;")
SIDE_STREAM = relu_cu("  if (i < n) y[i] = fmaxf(x[i], 0.f);",
                      extra="static void side() { cudaStream_t s; cudaStreamCreate(&s); }")


# --- run-time-only hacks for the CUDA adversarial suite (tests/sandbox/test_gpu_cuda.py) ---

# Replays a saved result when called again with the same input pointer: a device buffer and the
# last pointer kept in host statics (the CUDA build has no writable-data inspection, so only the
# run-time "same buffers, new contents" check can catch it).
POINTER_CACHE = relu_cu(
    "  if (i < n) y[i] = fmaxf(x[i], 0.f);",
    extra="static const float* g_last = nullptr;\nstatic float* g_saved = nullptr;\nstatic int64_t g_n = 0;")
POINTER_CACHE["kernels/relu.cu"] = POINTER_CACHE["kernels/relu.cu"].replace(
    "  relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);",
    "  if (x == g_last && n == g_n) {\n"
    "    cudaMemcpyAsync(y, g_saved, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);\n"
    "    return;\n  }\n"
    "  if (g_saved == nullptr || n != g_n) { cudaFree(g_saved); cudaMalloc(&g_saved, n * sizeof(float)); }\n"
    "  relu_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(x, y, n);\n"
    "  cudaMemcpyAsync(g_saved, y, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);\n"
    "  g_last = x; g_n = n;")

# Correct for the first calls (verification), then skips the work while being timed.
SKIP_WHEN_TIMED = relu_cu("  if (i < n) y[i] = fmaxf(x[i], 0.f);", extra="static int64_t g_calls = 0;")
SKIP_WHEN_TIMED["kernels/relu.cu"] = SKIP_WHEN_TIMED["kernels/relu.cu"].replace(
    "  relu_kernel<<<", "  if (++g_calls > 12) return;\n  relu_kernel<<<")

# Does the work on the stream it was given, plus ~2 ms of spinning per launch: launched from Python on a
# side stream (see test_gpu_cuda.py), the timed stream's events see almost nothing of it. `spin_f32`
# (one block spinning `cycles`) gives the timed stream ~50 us of its own, so the oracle times a few
# calls per trial rather than a batch of 1000 launches queued behind the hidden work.
_SPIN = """
__global__ void spin_kernel(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) { }
}
extern "C" void spin_f32(int64_t cycles, cudaStream_t stream) { spin_kernel<<<1, 32, 0, stream>>>(cycles); }
KRL_OP(spin_f32, "i64 cycles, stream")
"""
SLOW_RELU = relu_cu("  if (i < n) y[i] = fmaxf(x[i], 0.f);\n"
                    "  long long t0 = clock64();\n  while (clock64() - t0 < 4000000) { }", extra=_SPIN)

# Built by nvcc in CI (test_cuda_build.py); run on the GPU by the gpu-marked tests.
COMPILABLE = {"honest": HONEST, "wrong": WRONG, "input_mutation": INPUT_MUTATION,
              "illegal_address": ILLEGAL_ADDRESS, "hang": HANG, "pointer_cache": POINTER_CACHE,
              "skip_when_timed": SKIP_WHEN_TIMED, "slow_relu": SLOW_RELU}
