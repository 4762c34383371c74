// torch.sum(x, dim, keepdim=True) for a contiguous float32 x viewed as [outer, R, inner]:
//   y[o, 0, i] = sum_r x[o, r, i]     (accumulated in double, rounded once to float).
// inner > 1: the reduced dim is strided, so each task takes a tile of CH contiguous i and streams
//   the R rows of that tile (unit-stride loads, SIMD across i): float partial sums over blocks of
//   RB rows, each block folded into CH double accumulators.
// inner == 1: each output is the sum of one contiguous row: SIMD float partial sums over blocks,
//   added into a double. OpenMP splits the outputs (rows or (o, tile) pairs) across cores.
#include <cstdint>
#include "krl_abi.h"

extern "C" void sum_dim_f32(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t R,
                            int64_t inner) {
  if (inner == 1) {
    const int64_t BLK = 1024;
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const float* __restrict__ xr = x + o * R;
      double total = 0.0;
      for (int64_t r0 = 0; r0 < R; r0 += BLK) {
        const int64_t r1 = r0 + BLK < R ? r0 + BLK : R;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t r = r0; r < r1; ++r) s += xr[r];
        total += s;
      }
      y[o] = (float)total;
    }
    return;
  }
  const int64_t CH = 1024, RB = 64;  // RB rows summed in float, then folded into double
  const int64_t tiles = (inner + CH - 1) / CH;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t i0 = t * CH;
      const int64_t n = inner - i0 < CH ? inner - i0 : CH;
      const float* __restrict__ xo = x + o * R * inner + i0;
      double acc[CH];
      float part[CH];
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) acc[i] = 0.0;
      for (int64_t r0 = 0; r0 < R; r0 += RB) {
        const int64_t r1 = r0 + RB < R ? r0 + RB : R;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) part[i] = 0.0f;
        int64_t r = r0;
        for (; r + 4 <= r1; r += 4) {  // four rows per sweep: a quarter of the part[] traffic
          const float* __restrict__ a = xo + r * inner;
          const float* __restrict__ b = a + inner;
          const float* __restrict__ c = b + inner;
          const float* __restrict__ d = c + inner;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) part[i] += (a[i] + b[i]) + (c[i] + d[i]);
        }
        for (; r < r1; ++r) {
          const float* __restrict__ xr = xo + r * inner;
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) part[i] += xr[i];
        }
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) acc[i] += (double)part[i];
      }
      float* __restrict__ yo = y + o * inner + i0;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) yo[i] = (float)acc[i];
    }
  }
}
KRL_OP(sum_dim_f32, "const f32* x, f32* y, i64 outer, i64 R, i64 inner")
