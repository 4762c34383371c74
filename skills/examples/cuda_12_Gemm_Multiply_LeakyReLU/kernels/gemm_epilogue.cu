// y = leaky_relu((x @ W^T + b) * multiplier) with 64x64 output tiles, 16-deep K slices in shared
// memory and a 4x4 register tile per thread; the epilogue is applied before the single store.
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

#define TM 64
#define TN 64
#define TK 16

__global__ void gemm_mul_lrelu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ bias, float* __restrict__ y, int B, int K, int N,
                                      float m, float s) {
  __shared__ float xs[TK][TM + 1];
  __shared__ float ws[TK][TN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;  // 256 threads: 16x16, each 4x4 outputs
  const int row0 = blockIdx.y * TM, col0 = blockIdx.x * TN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int t = threadIdx.x; t < TM * TK; t += 256) {  // load x[row0:+64, k0:+16] and w[col0:+64, k0:+16]
      int r = t / TK, c = t % TK;
      xs[c][r] = (row0 + r < B && k0 + c < K) ? x[(int64_t)(row0 + r) * K + k0 + c] : 0.f;
      ws[c][r] = (col0 + r < N && k0 + c < K) ? w[(int64_t)(col0 + r) * K + k0 + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { a[i] = xs[kk][ty * 4 + i]; b[i] = ws[kk][tx * 4 + i]; }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int r = row0 + ty * 4 + i;
    if (r >= B) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int c = col0 + tx * 4 + j;
      if (c >= N) continue;
      float v = (acc[i][j] + bias[c]) * m;
      y[(int64_t)r * N + c] = v > 0.f ? v : v * s;
    }
  }
}

extern "C" void gemm_mul_lrelu(const float* x, const float* w, const float* bias, float* y, int64_t B, int64_t K,
                               int64_t N, double multiplier, double slope, cudaStream_t stream) {
  dim3 grid((unsigned)((N + TN - 1) / TN), (unsigned)((B + TM - 1) / TM));
  gemm_mul_lrelu_kernel<<<grid, 256, 0, stream>>>(x, w, bias, y, (int)B, (int)K, (int)N, (float)multiplier,
                                                   (float)slope);
}
KRL_OP(gemm_mul_lrelu, "const f32* x, const f32* w, const f32* bias, f32* y, i64 B, i64 K, i64 N, f64 multiplier, f64 slope, stream")
