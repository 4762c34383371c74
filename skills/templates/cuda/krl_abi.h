// kernelrl fixed binding infrastructure (NOT editable by the agent).
//
// A kernel file exposes plain C functions that take raw pointers and sizes,
// and registers each one with KRL_OP(function, "signature"). No torch, ATen,
// c10, pybind11 or Python headers: builds stay cheap (about the compiler's own
// time for your kernel).
//
// Signature: comma-separated "type name" pairs, in the function's order.
//   pointer types (pass a contiguous torch.Tensor of that dtype):
//     f32* f64* f16* bf16* i8* u8* i16* i32* i64* bool*   (a leading "const" is allowed)
//   scalar types (pass a Python int/float): i32 i64 f32 f64
//   stream (CUDA only; filled in automatically with the current CUDA stream)
//
//   extern "C" void relu_f32(const float* x, float* y, int64_t n) { ... }
//   KRL_OP(relu_f32, "const f32* x, f32* y, i64 n")
//
// In Python (model_new.py):  import krl; ops = krl.ops(); ops.relu_f32(x, y, x.numel())
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct krl_op {
  const char* name;
  const char* sig;
  void* fn;
  const struct krl_op* next;
} krl_op;

void krl_register(krl_op* op);

#ifdef __cplusplus
}
#endif

#define KRL_CONCAT_(a, b) a##b
#define KRL_CONCAT(a, b) KRL_CONCAT_(a, b)

// Register an extern "C" function under its own name with its signature string.
#define KRL_OP(fn, sig)                                                        \
  static krl_op KRL_CONCAT(krl_op_desc_, fn) = {#fn, sig, (void*)&fn, 0};      \
  static int KRL_CONCAT(krl_op_reg_, fn) =                                     \
      (krl_register(&KRL_CONCAT(krl_op_desc_, fn)), 0);
