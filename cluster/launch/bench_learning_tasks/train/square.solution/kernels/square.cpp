#include <cstdint>
#include "krl_abi.h"

extern "C" void square_f32(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i];
}
KRL_OP(square_f32, "const f32* x, f32* y, i64 n")
