// LeakyReLU over a contiguous float32 buffer: OpenMP across cores, SIMD within a core.
// The slope arrives as a double scalar (KRL_OP "f64") and is rounded to float once.
//
// The op is purely memory-bound (one load + one store per element). With AVX-512 the
// stores are non-temporal (_mm512_stream_ps): the freshly allocated output is not read
// into the cache before being overwritten, which saves a third of the memory traffic.
#include <cstdint>
#include <immintrin.h>
#include "krl_abi.h"

static inline float leaky(float v, float s) { return v > 0.0f ? v : v * s; }

#if defined(__AVX512F__)
// One 16-float block: load, compare with 0, blend with v*s, streaming store.
__attribute__((nothrow)) static inline void leaky_block16(const float* x, float* y, __m512 vs) {
  const __m512 v = _mm512_loadu_ps(x);
  const __mmask16 pos = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GT_OQ);
  _mm512_stream_ps(y, _mm512_mask_blend_ps(pos, _mm512_mul_ps(v, vs), v));
}
// Streaming stores are weakly ordered: each thread fences its own before the join.
__attribute__((nothrow)) static inline void store_fence() { _mm_sfence(); }
#endif

extern "C" void leaky_relu_f32(const float* __restrict__ x, float* __restrict__ y, int64_t n,
                               double negative_slope) {
  const float s = static_cast<float>(negative_slope);
#if defined(__AVX512F__)
  // Scalar head until y is 64-byte aligned (streaming stores need alignment), then
  // 16-float blocks split across threads, then a scalar tail.
  int64_t head = static_cast<int64_t>((64 - (reinterpret_cast<uintptr_t>(y) & 63)) & 63) / 4;
  if ((reinterpret_cast<uintptr_t>(y) & 3) != 0 || head > n) head = n;  // odd pointer: scalar
  for (int64_t i = 0; i < head; ++i) y[i] = leaky(x[i], s);
  const int64_t nblk = (n - head) / 16;
  const float* xb = x + head;
  float* yb = y + head;
  const __m512 vs = _mm512_set1_ps(s);
#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t b = 0; b < nblk; ++b) leaky_block16(xb + 16 * b, yb + 16 * b, vs);
    store_fence();
  }
  for (int64_t i = head + 16 * nblk; i < n; ++i) y[i] = leaky(x[i], s);
#else
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = leaky(x[i], s);
#endif
}
KRL_OP(leaky_relu_f32, "const f32* x, f32* y, i64 n, f64 negative_slope")
