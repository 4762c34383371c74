// kernelrl fixed binding infrastructure (NOT editable by the agent): the op registry
// that every kernel file's KRL_OP adds itself to; krl.py reads it through krl_ops().
#include "krl_abi.h"

static const krl_op* krl_registry_head = 0;

extern "C" __attribute__((visibility("default"))) void krl_register(krl_op* op) {
  op->next = krl_registry_head;
  krl_registry_head = op;
}

extern "C" __attribute__((visibility("default"))) const krl_op* krl_ops(void) { return krl_registry_head; }

extern "C" __attribute__((visibility("default"))) int krl_abi_version(void) { return 1; }
