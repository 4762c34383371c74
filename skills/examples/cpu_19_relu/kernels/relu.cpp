// ReLU over a contiguous float32 buffer: OpenMP across cores, SIMD within a core.
#include <cstdint>
#include "krl_abi.h"

extern "C" void relu_f32(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i];
    y[i] = v > 0.0f ? v : 0.0f;
  }
}
KRL_OP(relu_f32, "const f32* x, f32* y, i64 n")
