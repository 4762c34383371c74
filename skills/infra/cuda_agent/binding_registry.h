// CUDA-Agent's binding registry (fixed infrastructure, kernelrl's version): each kernels/<name>_binding.cpp
// defines its wrappers and `REGISTER_BINDING(name) { m.def(...); }`; binding.cpp's module init calls every one.
// No static registration objects: the library has no constructors of its own (binpolicy).
#pragma once
#include <torch/types.h>
#include <torch/csrc/utils/pybind.h>

#define REGISTER_BINDING(name) void krl_register_binding_##name(pybind11::module_& m)
