// Row-wise softmax over a [rows, cols] float32 buffer (torch.softmax(x, dim=1) of a 2-D input).
// OpenMP splits rows across cores; each row takes three SIMD passes that stay in cache for
// moderate rows: max, exp(x - max) written to y with a blocked sum, then y *= 1/sum.
// std::exp does not vectorise without -ffast-math, so exp is simd_expf from krl_math.h (a
// branch-free Cephes-style polynomial, about 1 ulp) that `omp simd` turns into AVX2/AVX-512 code.
#include <cmath>
#include <cstdint>
#include "krl_abi.h"
#include "krl_math.h"

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
        const float e = simd_expf(xr[j] - m);
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
