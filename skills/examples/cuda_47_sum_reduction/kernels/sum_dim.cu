// Sum over the middle dimension of a contiguous (outer, reduce, inner) float32 tensor, keepdim:
// one thread per (outer, inner) output, looping over `reduce` (a warp reads contiguous inner columns).
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t outer, int64_t reduce,
                               int64_t inner) {
  const int64_t total = outer * inner;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t o = t / inner, p = t % inner;
    const float* xp = x + o * reduce * inner + p;
    float acc = 0.f;
    for (int64_t r = 0; r < reduce; ++r) acc += xp[r * inner];
    y[t] = acc;
  }
}

extern "C" void sum_dim_f32(const float* x, float* y, int64_t outer, int64_t reduce, int64_t inner,
                            cudaStream_t stream) {
  const int threads = 256;
  int64_t blocks = (outer * inner + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 132 * 64) blocks = 132 * 64;
  sum_dim_kernel<<<(unsigned)blocks, threads, 0, stream>>>(x, y, outer, reduce, inner);
}
KRL_OP(sum_dim_f32, "const f32* x, f32* y, i64 outer, i64 reduce, i64 inner, stream")
