// Row-wise softmax over a [rows, cols] float32 buffer (torch.softmax(x, dim=1) of a 2-D input).
// OpenMP splits rows across cores; each row takes three SIMD passes that stay in cache for
// moderate rows: max, exp(x - max) written to y with a blocked sum, then y *= 1/sum.
// std::exp does not vectorise without -ffast-math, so exp is a branch-free Cephes-style
// polynomial (about 1 ulp) that `omp simd` turns into AVX2/AVX-512 code (no floorf, no
// function calls, the 2^n scale built from its bit pattern).
#include <cmath>
#include <cstdint>
#include "krl_abi.h"

static inline float exp_simd(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // round(x / ln2) to nearest with the 1.5 * 2^23 trick (floorf does not vectorise without -ffast-math)
  const float fx = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - fx * 0.693359375f;                                 // x - n*ln2, split in two parts
  r = r - fx * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)fx + 127) << 23;                 // 2^n
  union { int32_t i; float f; } u;
  u.i = bits;
  return p * u.f;
}

extern "C" void softmax_rows_f32(const float* __restrict__ x, float* __restrict__ y, int64_t rows,
                                 int64_t cols) {
  const int64_t BLK = 1024;  // float partial sums per block, accumulated into a double
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict__ xr = x + r * cols;
    float* __restrict__ yr = y + r * cols;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
    double total = 0.0;
    for (int64_t j0 = 0; j0 < cols; j0 += BLK) {
      const int64_t j1 = j0 + BLK < cols ? j0 + BLK : cols;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = j0; j < j1; ++j) {
        const float e = exp_simd(xr[j] - m);
        yr[j] = e;
        s += e;
      }
      total += s;
    }
    const float inv = (float)(1.0 / total);
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) yr[j] *= inv;
  }
}
KRL_OP(softmax_rows_f32, "const f32* x, f32* y, i64 rows, i64 cols")
