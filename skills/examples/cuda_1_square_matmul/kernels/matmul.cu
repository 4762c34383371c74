// C = A @ B for row-major A (M, K) and B (K, N), float32: 64x64 output tile per 256-thread block,
// 16-deep K slices of A and B staged in shared memory, 4x4 outputs per thread in registers.
#include <cuda_runtime.h>
#include <cstdint>
#include "krl_abi.h"

#define TM 64
#define TN 64
#define TK 16

__global__ void matmul_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                              int M, int K, int N) {
  __shared__ float as[TK][TM + 1];
  __shared__ float bs[TK][TN + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int row0 = blockIdx.y * TM, col0 = blockIdx.x * TN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int t = threadIdx.x; t < TM * TK; t += 256) {
      int r = t / TK, kc = t % TK;  // A tile: 64 rows x 16 k, k contiguous in memory
      as[kc][r] = (row0 + r < M && k0 + kc < K) ? a[(int64_t)(row0 + r) * K + k0 + kc] : 0.f;
      int kr = t / TN, cc = t % TN;  // B tile: 16 k x 64 columns, columns contiguous in memory
      bs[kr][cc] = (k0 + kr < K && col0 + cc < N) ? b[(int64_t)(k0 + kr) * N + col0 + cc] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TK; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) { av[i] = as[kk][ty * 4 + i]; bv[i] = bs[kk][tx * 4 + i]; }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += av[i] * bv[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    int r = row0 + ty * 4 + i;
    if (r >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int col = col0 + tx * 4 + j;
      if (col < N) c[(int64_t)r * N + col] = acc[i][j];
    }
  }
}

extern "C" void matmul_f32(const float* a, const float* b, float* c, int64_t M, int64_t K, int64_t N,
                           cudaStream_t stream) {
  dim3 grid((unsigned)((N + TN - 1) / TN), (unsigned)((M + TM - 1) / TM));
  matmul_kernel<<<grid, 256, 0, stream>>>(a, b, c, (int)M, (int)K, (int)N);
}
KRL_OP(matmul_f32, "const f32* a, const f32* b, f32* c, i64 M, i64 K, i64 N, stream")
