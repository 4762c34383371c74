// Mean squared error over two contiguous float32 buffers of n elements, written to out[0]:
//   out = sum_i (p[i] - t[i])^2 / n.
// One fused pass (no difference / square temporaries): OpenMP splits fixed-size blocks across
// cores; each block is summed in float with SIMD lanes, folded into a per-thread double, and the
// thread totals are combined by the OpenMP reduction. The mean is taken in double.
#include <cmath>
#include <cstdint>
#include "krl_abi.h"

extern "C" void mse_f32(const float* __restrict__ p, const float* __restrict__ t, float* __restrict__ out,
                        int64_t n) {
  const int64_t BLK = 4096;
  const int64_t blocks = (n + BLK - 1) / BLK;
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * BLK;
    const int64_t i1 = i0 + BLK < n ? i0 + BLK : n;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = i0; i < i1; ++i) {
      const float d = p[i] - t[i];
      s += d * d;
    }
    total += (double)s;
  }
  out[0] = n > 0 ? (float)(total / (double)n) : NAN;
}
KRL_OP(mse_f32, "const f32* p, const f32* t, f32* out, i64 n")
