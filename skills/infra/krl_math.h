// kernelrl fixed infrastructure (NOT editable by the agent): vectorisable float math for CPU kernels.
//
// libm's expf/tanhf/erff are scalar calls, and GCC keeps a loop that calls them scalar (no
// -ffast-math here), so an `omp simd` loop needs its transcendental functions inline and
// branch-free. #include "krl_math.h" and call simd_expf(x) inside the loop.
#pragma once
#include <cstdint>
#include <cstring>

// e^x, about 1 ulp, for x clamped to [-87, 88] (so 2^n stays a normal float): Cody-Waite range
// reduction and a degree-6 polynomial (Cephes expf). Rounding by the 1.5 * 2^23 trick and clamps
// by plain ternaries, because std::floor / std::fmin / std::fmax keep GCC's loop scalar.
static inline float simd_expf(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
  float r = x - n * 0.693359375f;  // x - n*ln2, ln2 split in two parts
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;  // e^r on [-ln2/2, ln2/2]
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}
