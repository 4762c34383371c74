// The one extension module of a CUDA-Agent workspace (fixed infrastructure): applies every binding file's
// REGISTER_BINDING function, listed by the builder in krl_bindings_list.h.
#include "binding_registry.h"

#define KRL_BINDING_FN(name) void krl_register_binding_##name(pybind11::module_& m);
#include "krl_bindings_list.h"
#undef KRL_BINDING_FN

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#define KRL_BINDING_FN(name) krl_register_binding_##name(m);
#include "krl_bindings_list.h"
#undef KRL_BINDING_FN
}
