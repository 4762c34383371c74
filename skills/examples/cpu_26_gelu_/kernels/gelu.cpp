// Exact (erf-based) GELU over a contiguous float32 buffer, as F.gelu(x) with its default
// approximate='none':  gelu(x) = x * Phi(x),  Phi(x) = 0.5 * (1 + erf(x / sqrt(2))).
//
// Phi is computed through erfc(|x|/sqrt(2)) with Abramowitz & Stegun 7.1.26
// (|error| <= 1.5e-7), so the negative tail has no 1 + erf cancellation:
//   q = 0.5 * erfc(|x|/sqrt 2);  Phi = x >= 0 ? 1 - q : q.
// Everything is branch-free float math with an inlined expf, so `omp simd` vectorises it
// (libm's erff/expf are scalar calls that would keep the loop scalar).
#include <cmath>
#include <cstdint>
#include "krl_abi.h"

// e^x for x clamped to [-87, 88] (2^n stays a normal float); branch-free so it vectorises.
// (GCC 12 keeps the loop scalar for std::floor / std::fmin / std::fmax without -ffast-math:
// hence std::nearbyint for the rounding and plain ternaries for the clamps.)
static inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = std::nearbyint(x * 1.44269504088896341f);  // round(x / ln2)
  float r = x - n * 0.693359375f;                                 // x - n*ln2 (hi part)
  r = r - n * -2.12194440e-4f;                                    // (lo part)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;  // e^r on [-ln2/2, ln2/2]
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  return p * __builtin_bit_cast(float, bits);
}

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
    const float q = 0.5f * p * t * exp_approx(-z * z);  // 0.5 * erfc(z)
    const float phi = v >= 0.0f ? 1.0f - q : q;
    y[i] = v * phi;
  }
}
KRL_OP(gelu_f32, "const f32* x, f32* y, i64 n")
