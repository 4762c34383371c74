// Row softmax of a (rows, cols) float32 matrix: one block per row. Pass 1 keeps a running
// (max, sum of exp) per thread (online softmax), merged across the block; pass 2 writes
// exp(x - max) / sum.
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

#define THREADS 1024

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  float mm = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.f : s * expf(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * expf(m2 - mm));
  m = mm;
}

__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  const float* xr = x + (int64_t)blockIdx.x * cols;
  float* yr = y + (int64_t)blockIdx.x * cols;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += THREADS) merge(m, s, xr[j], 1.f);
  // warp merge, then across warps through shared memory
  for (int off = 16; off > 0; off >>= 1) {
    float m2 = __shfl_down_sync(0xffffffff, m, off), s2 = __shfl_down_sync(0xffffffff, s, off);
    merge(m, s, m2, s2);
  }
  __shared__ float sm[THREADS / 32], ss[THREADS / 32];
  __shared__ float row_max, row_inv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { sm[warp] = m; ss[warp] = s; }
  __syncthreads();
  if (warp == 0) {
    m = lane < THREADS / 32 ? sm[lane] : -INFINITY;
    s = lane < THREADS / 32 ? ss[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) {
      float m2 = __shfl_down_sync(0xffffffff, m, off), s2 = __shfl_down_sync(0xffffffff, s, off);
      merge(m, s, m2, s2);
    }
    if (lane == 0) { row_max = m; row_inv = 1.f / s; }
  }
  __syncthreads();
  const float mx = row_max, inv = row_inv;
  for (int64_t j = threadIdx.x; j < cols; j += THREADS) yr[j] = expf(xr[j] - mx) * inv;
}

extern "C" void softmax_rows(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows > 0) softmax_rows_kernel<<<(unsigned)rows, THREADS, 0, stream>>>(x, y, cols);
}
KRL_OP(softmax_rows, "const f32* x, f32* y, i64 rows, i64 cols, stream")
