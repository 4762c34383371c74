// Linear + subtract + multiply + ReLU, fused: relu((x @ W^T + b - sub) * mul) in the GEMM's epilogue.
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

#define TM 64
#define TN 64
#define TK 16

// y[r][c] = epilogue(sum_k x[r][k] * w[c][k] + bias[c]) for x (B, K) and w (N, K), both row-major (nn.Linear).
// 64x64 output tile per 256-thread block, 16-deep K slices staged in shared memory, 4x4 outputs per thread.
__global__ void gemm_xwT_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                const float* __restrict__ bias, float* __restrict__ y, int B, int K, int N,
                                float p0, float p1) {
  __shared__ float xs[TK][TM + 1];
  __shared__ float ws[TK][TN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int row0 = blockIdx.y * TM, col0 = blockIdx.x * TN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int t = threadIdx.x; t < TM * TK; t += 256) {
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
      float v = acc[i][j] + bias[c];
      y[(int64_t)r * N + c] = fmaxf((v - p0) * p1, 0.f);
    }
  }
}

extern "C" void linear_sub_mul_relu(const float* x, const float* w, const float* bias, float* y, int64_t B,
                                    int64_t K, int64_t N, double sub, double mul, cudaStream_t stream) {
  dim3 grid((unsigned)((N + TN - 1) / TN), (unsigned)((B + TM - 1) / TM));
  gemm_xwT_kernel<<<grid, 256, 0, stream>>>(x, w, bias, y, (int)B, (int)K, (int)N, (float)sub, (float)mul);
}
KRL_OP(linear_sub_mul_relu, "const f32* x, const f32* w, const f32* bias, f32* y, i64 B, i64 K, i64 N, f64 sub, f64 mul, stream")
