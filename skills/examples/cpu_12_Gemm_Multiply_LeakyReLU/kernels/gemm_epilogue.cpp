// y = leaky_relu((x @ W^T + b) * multiplier): one pass, the epilogue fused into the GEMM.
// x [B, K] and W [N, K] are both row-major, so every dot product reads two contiguous rows;
// 4 rows of x share each W row load (register blocking), OpenMP splits the (row-block, n) space.
#include <cstdint>
#include "krl_abi.h"

extern "C" void gemm_mul_lrelu(const float* __restrict__ x, const float* __restrict__ w,
                               const float* __restrict__ bias, float* __restrict__ y, int64_t B, int64_t K,
                               int64_t N, double multiplier, double slope) {
  const float m = (float)multiplier, s = (float)slope;
  const int64_t RB = 4;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t i0 = 0; i0 < B; i0 += RB) {
    for (int64_t j = 0; j < N; ++j) {
      const float* wr = w + j * K;
      float acc[RB] = {0.f, 0.f, 0.f, 0.f};
      const int64_t rows = (B - i0) < RB ? (B - i0) : RB;
      for (int64_t r = 0; r < rows; ++r) {
        const float* xr = x + (i0 + r) * K;
        float a = 0.f;
#pragma omp simd reduction(+ : a)
        for (int64_t k = 0; k < K; ++k) a += xr[k] * wr[k];
        acc[r] = a;
      }
      for (int64_t r = 0; r < rows; ++r) {
        float v = (acc[r] + bias[j]) * m;
        y[(i0 + r) * N + j] = v > 0.f ? v : v * s;
      }
    }
  }
}
KRL_OP(gemm_mul_lrelu, "const f32* x, const f32* w, const f32* bias, f32* y, i64 B, i64 K, i64 N, f64 multiplier, f64 slope")
