// mean((p - t)^2) over two contiguous float32 buffers: each block writes a partial sum (float accumulation
// per thread, double across the block) to `partial`; one final block adds the partials in a fixed order.
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

#define THREADS 256

__device__ double block_sum(double v) {
  __shared__ double sh[THREADS / 32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffff, v, off);
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < THREADS / 32 ? sh[threadIdx.x] : 0.0;
  if (threadIdx.x < 32)
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffff, v, off);
  return v;  // valid in thread 0
}

__global__ void sq_diff_partial(const float* __restrict__ p, const float* __restrict__ t, double* __restrict__ partial,
                                int64_t n) {
  float acc = 0.f;
  const int64_t stride = (int64_t)gridDim.x * THREADS;
  for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride) {
    float d = p[i] - t[i];
    acc += d * d;
  }
  double s = block_sum((double)acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void finish_mean(const double* __restrict__ partial, int nparts, float* __restrict__ out, int64_t n) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < nparts; i += THREADS) acc += partial[i];
  double s = block_sum(acc);
  if (threadIdx.x == 0) out[0] = (float)(s / (double)n);
}

extern "C" void mse_f32(const float* p, const float* t, double* partial, int64_t nparts, float* out, int64_t n,
                        cudaStream_t stream) {
  sq_diff_partial<<<(unsigned)nparts, THREADS, 0, stream>>>(p, t, partial, n);
  finish_mean<<<1, THREADS, 0, stream>>>(partial, (int)nparts, out, n);
}
KRL_OP(mse_f32, "const f32* p, const f32* t, f64* partial, i64 nparts, f32* out, i64 n, stream")
