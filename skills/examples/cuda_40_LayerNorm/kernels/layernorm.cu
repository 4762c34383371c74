// LayerNorm over the last D elements of each row (rows x D float32), with weight and bias of D elements.
// Rows are long (D = 4M in the task) and few, so each row is split over many blocks: pass 1 writes per-block
// (sum, sum of squares) partials, pass 2 turns them into mean and 1/std per row (double), pass 3 normalises.
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

#define THREADS 256

__device__ double block_sum(double v, double* sh) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffff, v, off);
  __syncthreads();  // sh may still be read by a previous call
  if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
  __syncthreads();
  v = threadIdx.x < THREADS / 32 ? sh[threadIdx.x] : 0.0;
  if (threadIdx.x < 32)
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffff, v, off);
  return v;  // valid in thread 0
}

__global__ void ln_partial(const float* __restrict__ x, double* __restrict__ partial, int64_t d) {
  __shared__ double sh[THREADS / 32];
  const float* xr = x + (int64_t)blockIdx.y * d;
  float s = 0.f, q = 0.f;
  for (int64_t j = (int64_t)blockIdx.x * THREADS + threadIdx.x; j < d; j += (int64_t)gridDim.x * THREADS) {
    float v = xr[j];
    s += v;
    q += v * v;
  }
  double bs = block_sum((double)s, sh);
  double bq = block_sum((double)q, sh);
  if (threadIdx.x == 0) {
    double* p = partial + ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * 2;
    p[0] = bs;
    p[1] = bq;
  }
}

__global__ void ln_stats(const double* __restrict__ partial, int parts, float* __restrict__ stats, int64_t d,
                         float eps) {
  __shared__ double sh[THREADS / 32];
  const double* p = partial + (int64_t)blockIdx.x * parts * 2;
  double s = 0.0, q = 0.0;
  for (int i = threadIdx.x; i < parts; i += THREADS) { s += p[2 * i]; q += p[2 * i + 1]; }
  s = block_sum(s, sh);
  q = block_sum(q, sh);
  if (threadIdx.x == 0) {
    double mean = s / (double)d;
    double var = q / (double)d - mean * mean;
    if (var < 0.0) var = 0.0;
    stats[2 * blockIdx.x] = (float)mean;
    stats[2 * blockIdx.x + 1] = (float)(1.0 / sqrt(var + (double)eps));
  }
}

__global__ void ln_apply(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                         const float* __restrict__ stats, float* __restrict__ y, int64_t rows, int64_t d) {
  const int64_t total = rows * d;
  for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < total; i += (int64_t)gridDim.x * THREADS) {
    const int64_t r = i / d, j = i % d;
    y[i] = (x[i] - stats[2 * r]) * stats[2 * r + 1] * w[j] + b[j];
  }
}

extern "C" void layernorm_f32(const float* x, const float* w, const float* b, double* partial, int64_t parts,
                              float* stats, float* y, int64_t rows, int64_t d, double eps, cudaStream_t stream) {
  if (rows <= 0) return;
  ln_partial<<<dim3((unsigned)parts, (unsigned)rows), THREADS, 0, stream>>>(x, partial, d);
  ln_stats<<<(unsigned)rows, THREADS, 0, stream>>>(partial, (int)parts, stats, d, (float)eps);
  int64_t blocks = (rows * d + THREADS - 1) / THREADS;
  if (blocks > 132 * 32) blocks = 132 * 32;
  ln_apply<<<(unsigned)blocks, THREADS, 0, stream>>>(x, w, b, stats, y, rows, d);
}
KRL_OP(layernorm_f32, "const f32* x, const f32* w, const f32* b, f64* partial, i64 parts, f32* stats, f32* y, i64 rows, i64 d, f64 eps, stream")
