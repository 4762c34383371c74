// Linear + GELU (erf) fused in the GEMM epilogue, then a row softmax (one block per row) in place on y.
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
      y[(int64_t)r * N + c] = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    }
  }
}

#define SM_THREADS 1024

__device__ __forceinline__ void merge(float& m, float& s, float m2, float s2) {
  float mm = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.f : s * expf(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * expf(m2 - mm));
  m = mm;
}

__global__ void softmax_rows_inplace(float* __restrict__ y, int64_t cols) {
  float* yr = y + (int64_t)blockIdx.x * cols;
  float m = -INFINITY, s = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += SM_THREADS) merge(m, s, yr[j], 1.f);
  for (int off = 16; off > 0; off >>= 1) {
    float m2 = __shfl_down_sync(0xffffffff, m, off), s2 = __shfl_down_sync(0xffffffff, s, off);
    merge(m, s, m2, s2);
  }
  __shared__ float sm[SM_THREADS / 32], ss[SM_THREADS / 32];
  __shared__ float row_max, row_inv;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) { sm[warp] = m; ss[warp] = s; }
  __syncthreads();
  if (warp == 0) {
    m = sm[lane];
    s = ss[lane];
    for (int off = 16; off > 0; off >>= 1) {
      float m2 = __shfl_down_sync(0xffffffff, m, off), s2 = __shfl_down_sync(0xffffffff, s, off);
      merge(m, s, m2, s2);
    }
    if (lane == 0) { row_max = m; row_inv = 1.f / s; }
  }
  __syncthreads();
  const float mx = row_max, inv = row_inv;
  for (int64_t j = threadIdx.x; j < cols; j += SM_THREADS) yr[j] = expf(yr[j] - mx) * inv;
}

extern "C" void linear_gelu_softmax(const float* x, const float* w, const float* bias, float* y, int64_t B,
                                    int64_t K, int64_t N, cudaStream_t stream) {
  dim3 grid((unsigned)((N + TN - 1) / TN), (unsigned)((B + TM - 1) / TM));
  gemm_xwT_kernel<<<grid, 256, 0, stream>>>(x, w, bias, y, (int)B, (int)K, (int)N, 0.f, 0.f);
  if (B > 0) softmax_rows_inplace<<<(unsigned)B, SM_THREADS, 0, stream>>>(y, N);
}
KRL_OP(linear_gelu_softmax, "const f32* x, const f32* w, const f32* bias, f32* y, i64 B, i64 K, i64 N, stream")
