// RMS norm over dim 1 of a (B, F, *) float32 tensor: one thread per (b, spatial position); it reads its
// F values (stride = spatial size, so a warp's loads are contiguous), then writes x / rms.
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

__global__ void rmsnorm_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t batch, int64_t feats,
                               int64_t inner, float eps) {
  const int64_t total = batch * inner;
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += stride) {
    const int64_t b = t / inner, p = t % inner;
    const float* xp = x + b * feats * inner + p;
    float* yp = y + b * feats * inner + p;
    float ss = 0.f;
    for (int64_t f = 0; f < feats; ++f) { float v = xp[f * inner]; ss += v * v; }
    const float inv = rsqrtf(ss / (float)feats + eps);
    for (int64_t f = 0; f < feats; ++f) yp[f * inner] = xp[f * inner] * inv;
  }
}

extern "C" void rmsnorm_f32(const float* x, float* y, int64_t batch, int64_t feats, int64_t inner, double eps,
                            cudaStream_t stream) {
  const int threads = 256;
  int64_t blocks = (batch * inner + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 132 * 64) blocks = 132 * 64;
  rmsnorm_kernel<<<(unsigned)blocks, threads, 0, stream>>>(x, y, batch, feats, inner, (float)eps);
}
KRL_OP(rmsnorm_f32, "const f32* x, f32* y, i64 batch, i64 feats, i64 inner, f64 eps, stream")
