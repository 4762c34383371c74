// RMSNorm over dim 1 of x viewed as [B, C, S] (S = product of the trailing dims):
//   y[b, c, s] = x[b, c, s] / sqrt(mean_c x[b, c, s]^2 + eps).
// The reduced dim is strided by S, so instead of one strided walk per output the kernel takes a
// tile of CH contiguous positions s and streams the C rows of that tile: every load is unit-stride
// and SIMD runs across s. Sums of squares are accumulated in double. The tile (C * CH floats) is
// still in cache for the second, normalising pass. OpenMP splits the (b, tile) space.
#include <cmath>
#include <cstdint>
#include "krl_abi.h"

extern "C" void rmsnorm_dim1_f32(const float* __restrict__ x, float* __restrict__ y, int64_t B, int64_t C,
                                 int64_t S, double eps) {
  const int64_t CH = 256;
  const int64_t tiles = (S + CH - 1) / CH;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t s0 = t * CH;
      const int64_t n = S - s0 < CH ? S - s0 : CH;
      const float* __restrict__ xb = x + b * C * S + s0;
      float* __restrict__ yb = y + b * C * S + s0;
      double acc[CH];
      float inv[CH];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) acc[i] = 0.0;
      for (int64_t c = 0; c < C; ++c) {
        const float* __restrict__ xr = xb + c * S;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          const double v = (double)xr[i];
          acc[i] += v * v;
        }
      }
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) inv[i] = (float)(1.0 / std::sqrt(acc[i] / (double)C + eps));
      for (int64_t c = 0; c < C; ++c) {
        const float* __restrict__ xr = xb + c * S;
        float* __restrict__ yr = yb + c * S;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv[i];
      }
    }
  }
}
KRL_OP(rmsnorm_dim1_f32, "const f32* x, f32* y, i64 B, i64 C, i64 S, f64 eps")
