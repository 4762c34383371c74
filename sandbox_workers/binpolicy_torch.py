"""binpolicy's rules for torch extensions (KernelBench load_inline, CUDA-Agent): allocation yes, torch compute no.

A torch extension links libtorch and carries pybind11's runtime, so its undefined symbols are judged by
namespace (demangled):
- allowed: c10 (core types, TensorImpl accessors, checks, CUDA stream/guard helpers) except the dispatcher;
  ``at::TensorBase`` accessors; ``at::detail::empty_*``; ``at::_ops::<op>::call`` for the ops in
  ``ALLOC_OPS`` (allocation, views, metadata: the C++ twins of guards.CREATION); the pybind11 runtime and the
  tensor type caster (``torch::PyWarningHandler``, ``THPVariable_*``); the Python C API but code execution and
  imports; libstdc++; a few libc functions pybind11 prints errors with.
- refused as ``torch_compute``: every other ``at::_ops`` op (at::matmul, at::add, at::relu...), ``at::native``,
  ``at::cpu``/``at::cuda`` kernels, the c10 dispatcher (a way to call any op by name), the rest of at::/torch::.
Load-time code and writable data that torch's and pybind11's headers put in every extension (iostream's
initialiser, pybind11's internals, the module definition, thread-locals of the headers) are allowed; the
solution's own static constructors and globals are refused as in kernelrl's format.
"""
from __future__ import annotations

import re

from sandbox_workers.guards import FORBIDDEN_SYMBOL, MUTABLE_GLOBAL_STATE, STATIC_CONSTRUCTOR, TORCH_COMPUTE, \
    Violation

ALLOC_OPS = {"empty_memory_format", "empty_like", "empty_strided", "empty_names", "new_empty", "new_empty_strided",
             "new_zeros", "new_ones", "new_full", "zeros", "zeros_like", "zeros_names", "ones", "ones_like", "full",
             "full_like", "contiguous", "view", "view_dtype", "reshape", "_reshape_alias", "as_strided", "select_int",
             "slice_Tensor", "narrow", "permute", "transpose_int", "unsqueeze", "squeeze", "squeeze_dim", "expand",
             "flatten_using_ints", "t", "resize_", "_local_scalar_dense", "size_int", "stride_int", "sym_size_int",
             "sym_stride_int", "sym_numel", "alias", "detach"}
_ALLOWED_NS = re.compile(
    r"(c10::(?!Dispatcher|OperatorHandle|KernelFunction|impl::OperatorEntry|BoxedKernel)|caffe2::TypeMeta|"
    r"pybind11::|at::TensorBase::|at::detail::empty_|at::cuda::getCurrent\w+|at::cuda::warp_size|"
    r"torch::PyWarningHandler|torch::translate_exception_to_python|torch::autograd::AutogradMeta|"
    r"THPVariable)")
_OPS_CALL = re.compile(r"(?:\w+ for )?at::_ops::(\w+)::(call|redispatch)\b")
_TORCH_NAME = re.compile(r"(?:^|[\s*&])((?:torch|at|c10|caffe2|pybind11)::\S*)")
_EXTRA_RAW = re.compile(  # pybind11's runtime and libstdc++ as an extension uses them
    r"_?Py(?!Run_|_CompileString|Eval_EvalCode|Import_ExecCode|Import_Import|Import_ImportModule"
    r"(?!Level)|Marshal|_Exec|_Main|OS_System|Sys_SetObject|_RunMain)\w+|_ZN[KRO]*S\w+|_ZT[VTIS]N?K?St\w+|"
    r"_ZT[VIS]N10__cxxabiv1\w+|_ZT[IS][PK]*[a-z]|__dynamic_cast|__cxa_demangle|__cxa_get_exception_ptr|__tls_get_addr|"
    r"__libc_single_threaded|pthread_(mutex_(lock|unlock|trylock)|once|getspecific|setspecific|key_create|"
    r"key_delete|self|equal)|stderr|stdout|fputc|fputs|fprintf|fflush|fwrite|putc|strdup|strchr|strrchr|strstr|"
    r"strtol|strtoul|strtod|snprintf|vsnprintf|__snprintf_chk|__vsnprintf_chk|__fprintf_chk|sprintf|__sprintf_chk|"
    r"_ZN9__gnu_cxx\w+|_ZNK?9__gnu_cxx\w+|_ZSt\w+|__cxa_thread_atexit_impl|__cxa_thread_atexit|"
    r"THPVariable_\w+|THPVariableClass|THPDtypeType|THPLayoutType|THPMemoryFormatType|THPDevice_\w+")
_CUDA_EXTRA = re.compile(r"cuda(StreamGetCaptureInfo|StreamIsCapturing|GetDevice|SetDevice|DeviceGetAttribute|"
                         r"Free|Malloc)\w*")  # c10's CUDA guard/stream helpers, inlined into the extension
NEEDED = r"|lib(c10|torch|torch_cpu|torch_python|c10_cuda|torch_cuda|cudart)\.so(\.\d+)?"


def classify(raw: str, dem: str, backend: str) -> Violation | None | bool:
    """A symbol's verdict under the extension rules: None allowed, a Violation refused, False: not decided here
    (the backend's own allow-list decides)."""
    m = _OPS_CALL.search(dem)
    if m:
        if m.group(1) in ALLOC_OPS:
            return None
        return Violation(TORCH_COMPUTE, f"the extension calls the torch operator `{dem.split('(')[0]}` (ATen "
                                        "compute): kernels must compute themselves; only allocation, views and "
                                        f"metadata are allowed ({', '.join(sorted(ALLOC_OPS)[:6])}, ...)")
    name = _qualified(dem)
    if name and _ALLOWED_NS.match(name):
        return None
    if name or re.match(r"_ZN\d*(5torch|2at|3c10|6caffe2)", raw):
        return Violation(TORCH_COMPUTE, f"the extension calls `{dem[:200]}`: torch/ATen code other than "
                                        "allocation, views and metadata is not allowed in kernels")
    if _EXTRA_RAW.fullmatch(raw) or (backend == "cuda" and _CUDA_EXTRA.fullmatch(raw)):
        return None
    return False


def _qualified(dem: str) -> str:
    """The torch-namespace name a demangled symbol is about ("" when none): its return type and a
    `vtable for `-style prefix skipped."""
    head = re.sub(r"^(vtable|typeinfo|typeinfo name|VTT|guard variable|construction vtable) for ", "",
                  dem.split("(")[0])
    m = _TORCH_NAME.search(head)
    return m.group(1) if m else ""


def allowed_extension_state(v: Violation, module: str) -> bool:
    """Load-time code and writable data that torch's and pybind11's headers add to every extension."""
    d = v.detail
    if v.name == STATIC_CONSTRUCTOR:
        return bool(re.search(r"calls `(std::ios_base::Init::Init\(\)|__cxa_atexit)` at load time", d))
    if v.name == MUTABLE_GLOBAL_STATE:
        if re.match(r"(writable section \.tbss|\d+ bytes of writable data in \.tbss)", d):
            return True  # thread-locals of the headers; a named one of the solution's is still refused below
        m = re.match(r"`([^`]+)`", d)
        name = m.group(1) if m else ""
        return name == "std::__ioinit" or name.startswith((
            "pybind11::", f"PyInit_{module}::", "guard variable for pybind11::", "c10::", "at::", "torch::",
            f"pybind11_module_def_{module}", "guard variable for c10::", "guard variable for at::"))
    return False


def is_forbidden(v: Violation) -> bool:
    return v.name == FORBIDDEN_SYMBOL
