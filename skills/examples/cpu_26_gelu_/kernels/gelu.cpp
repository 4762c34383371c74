// Exact (erf-based) GELU over a contiguous float32 buffer, as F.gelu(x) with its default
// approximate='none':  gelu(x) = x * Phi(x),  Phi(x) = 0.5 * (1 + erf(x / sqrt(2))).
//
// Phi is computed through erfc(|x|/sqrt(2)) with Abramowitz & Stegun 7.1.26
// (|error| <= 1.5e-7), so the negative tail has no 1 + erf cancellation:
//   q = 0.5 * erfc(|x|/sqrt 2);  Phi = x >= 0 ? 1 - q : q.
// Everything is branch-free float math with simd_expf (krl_math.h), so `omp simd` vectorises it
// (libm's erff/expf are scalar calls that would keep the loop scalar).
#include <cmath>
#include <cstdint>
#include "krl_abi.h"
#include "krl_math.h"

extern "C" void gelu_f32(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float z = std::fabs(v) * 0.70710678118654752f;  // |x| / sqrt(2)
    const float t = 1.0f / (1.0f + 0.3275911f * z);
    float p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    const float q = 0.5f * p * t * simd_expf(-z * z);  // 0.5 * erfc(z)
    const float phi = v >= 0.0f ? 1.0f - q : q;
    y[i] = v * phi;
  }
}
KRL_OP(gelu_f32, "const f32* x, f32* y, i64 n")
