"""Static anti-hacking checks of a solution's sources; every finding has a stable name.

Python (model_new.py): imports limited to torch/krl/math, no try/except, no
reference Model, no torch compute calls (creation only), no introspection,
streams, threads, timers or tensor subclasses. C++/CUDA: no torch/ATen/Python
headers or APIs, includes from an allow-list, no I/O, processes, threads,
dynamic loading, inline assembly or side streams. These are a first speed bump for
honest mistakes; the trust model rests elsewhere (docs/sandbox.md: the judge, the OS
sandbox, binpolicy.py on the built library).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# Violation names (stable; tests, rewards and dashboards key on them).
TORCH_COMPUTE = "torch_compute"
CPP_TORCH = "cpp_torch"
CPP_FORBIDDEN = "cpp_forbidden_call"
FORBIDDEN_INCLUDE = "forbidden_include"
TRY_EXCEPT = "try_except_fallback"
REFERENCE_MODEL = "reference_model"
SIDE_STREAM = "side_stream"
THREADS = "threads"
TIMER_PATCHING = "timer_patching"
OUTPUT_CACHING = "output_caching"
INPUT_MUTATION = "input_mutation"
OUTPUT_ALIASES_INPUT = "output_aliases_input"
TENSOR_SUBCLASS = "tensor_subclass"
READS_EVALUATOR_FILES = "reads_evaluator_files"
FORBIDDEN_IMPORT = "forbidden_import"
INTROSPECTION = "introspection"
SANDBOX_ESCAPE = "sandbox_escape"
TIMED_OUTPUT_WRONG = "timed_output_mismatch"
# The built library (binpolicy.py): what the binary calls, runs at load time, keeps and executes.
FORBIDDEN_SYMBOL = "forbidden_symbol"
STATIC_CONSTRUCTOR = "static_constructor"
MUTABLE_GLOBAL_STATE = "mutable_global_state"
RAW_SYSCALL = "raw_syscall"


@dataclass(frozen=True)
class Violation:
    name: str
    detail: str


ALLOWED_IMPORTS = {"torch", "torch.nn", "krl", "math", "typing", "__future__"}
_IMPORT_NAMES = {"threading": THREADS, "_thread": THREADS, "concurrent": THREADS, "multiprocessing": THREADS,
                 "asyncio": THREADS, "time": TIMER_PATCHING, "timeit": TIMER_PATCHING, "model": REFERENCE_MODEL,
                 "os": READS_EVALUATOR_FILES, "pathlib": READS_EVALUATOR_FILES, "io": READS_EVALUATOR_FILES,
                 "sandbox_workers": READS_EVALUATOR_FILES, "inspect": INTROSPECTION, "gc": INTROSPECTION,
                 "sys": INTROSPECTION, "ctypes": SANDBOX_ESCAPE, "subprocess": SANDBOX_ESCAPE,
                 "socket": SANDBOX_ESCAPE, "importlib": SANDBOX_ESCAPE, "builtins": INTROSPECTION}
# torch.* / F.* / Tensor method names that only create or view memory (everything else is compute).
CREATION = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
            "full_like", "new_empty", "new_zeros", "new_ones", "new_full", "new_empty_strided", "arange",
            "tensor", "as_tensor", "device", "Size", "view", "reshape", "contiguous", "size", "stride", "numel",
            "dim", "data_ptr", "is_contiguous", "flatten", "unsqueeze", "squeeze", "permute", "transpose",
            "expand", "t", "narrow", "item", "float32", "float16", "bfloat16", "float64", "int32", "int64",
            "int8", "uint8", "bool", "dtype", "no_grad", "inference_mode", "is_tensor", "Tensor",
            "Parameter", "Module", "ModuleList", "ParameterList", "ParameterDict", "get_default_dtype"}
_BAD_CALLS = {"eval": INTROSPECTION, "exec": INTROSPECTION, "compile": INTROSPECTION, "getattr": INTROSPECTION,
              "setattr": INTROSPECTION, "delattr": INTROSPECTION, "globals": INTROSPECTION, "vars": INTROSPECTION,
              "locals": INTROSPECTION, "__import__": SANDBOX_ESCAPE, "open": READS_EVALUATOR_FILES,
              "breakpoint": INTROSPECTION}
_BAD_ATTRS = {"Stream": SIDE_STREAM, "stream": SIDE_STREAM, "Event": TIMER_PATCHING, "perf_counter": TIMER_PATCHING,
              "monotonic": TIMER_PATCHING, "register_forward_hook": INTROSPECTION,
              "register_forward_pre_hook": INTROSPECTION, "_make_subclass": TENSOR_SUBCLASS,
              "_make_wrapper_subclass": TENSOR_SUBCLASS, "as_subclass": TENSOR_SUBCLASS,
              "overrides": TENSOR_SUBCLASS, "os": READS_EVALUATOR_FILES, "sys": INTROSPECTION}
_OK_DUNDERS = {"__init__", "__name__", "__future__"}


def check_python(source: str) -> list[Violation]:
    """Static checks of model_new.py."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        return [Violation("syntax_error", f"model_new.py line {exc.lineno}: {exc.msg}")]
    found: list[Violation] = []
    aliases = {"torch": "torch", "nn": "torch.nn", "F": "torch.nn.functional"}
    for node in ast.walk(tree):
        found += _check_node(node, aliases)
    has_modelnew = any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body)
    if not has_modelnew:
        found.append(Violation("missing_modelnew", "model_new.py defines no top-level class ModelNew"))
    return _dedupe(found)


def _check_node(node: ast.AST, aliases: dict) -> list[Violation]:
    out = []
    line = getattr(node, "lineno", 0)
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
        for mod in mods:
            top = mod.split(".")[0]
            if mod == "torch.nn.functional" or (isinstance(node, ast.ImportFrom) and mod == "torch.nn"
                                                and any(a.name == "functional" for a in node.names)):
                out.append(Violation(TORCH_COMPUTE, f"line {line}: imports torch.nn.functional"))
            elif mod not in ALLOWED_IMPORTS:
                out.append(Violation(_IMPORT_NAMES.get(top, FORBIDDEN_IMPORT), f"line {line}: import {mod}"))
        if isinstance(node, ast.ImportFrom) and node.module in ("torch", "torch.nn"):
            for a in node.names:
                if a.name not in CREATION and a.name not in ("nn",):
                    out.append(Violation(TORCH_COMPUTE, f"line {line}: from {node.module} import {a.name}"))
    elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
        out.append(Violation(TRY_EXCEPT, f"line {line}: try/except is not allowed in model_new.py"))
    elif isinstance(node, ast.Name):
        if node.id == "Model":
            out.append(Violation(REFERENCE_MODEL, f"line {line}: uses the reference {node.id!r}"))
        elif node.id in _BAD_CALLS:
            out.append(Violation(_BAD_CALLS[node.id], f"line {line}: {node.id}"))
        elif node.id.startswith("__") and node.id not in _OK_DUNDERS:
            out.append(Violation(INTROSPECTION, f"line {line}: {node.id}"))
    elif isinstance(node, ast.Attribute):
        if node.attr in _BAD_ATTRS:
            out.append(Violation(_BAD_ATTRS[node.attr], f"line {line}: .{node.attr}"))
        elif node.attr.startswith("_") and node.attr not in _OK_DUNDERS:
            out.append(Violation(INTROSPECTION, f"line {line}: attribute {node.attr}"))
        elif node.attr in ("Model",):
            out.append(Violation(REFERENCE_MODEL, f"line {line}: .Model"))
        else:
            base = _dotted(node.value)
            full = aliases.get(base.split(".")[0], base.split(".")[0]) + base[len(base.split(".")[0]):]
            if full in ("torch", "torch.nn.functional", "torch.special", "torch.linalg", "torch.fft") \
                    and node.attr not in CREATION:
                out.append(Violation(TORCH_COMPUTE, f"line {line}: {base}.{node.attr}"))
    elif isinstance(node, ast.ClassDef):
        for b in node.bases:
            name = _dotted(b)
            if name.split(".")[-1] == "Model":
                out.append(Violation(REFERENCE_MODEL, f"line {line}: class {node.name} inherits {name}"))
            if name in ("torch.Tensor", "Tensor"):
                out.append(Violation(TENSOR_SUBCLASS, f"line {line}: class {node.name} subclasses {name}"))
    elif isinstance(node, ast.FunctionDef) and node.name in ("__torch_function__", "__torch_dispatch__"):
        out.append(Violation(TENSOR_SUBCLASS, f"line {line}: defines {node.name}"))
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        out.append(Violation(OUTPUT_CACHING, f"line {line}: global/nonlocal state"))
    return out


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _dotted(node.value) + "." + node.attr
    return ""


def _dedupe(found: list[Violation]) -> list[Violation]:
    seen, out = set(), []
    for v in found:
        if (v.name, v.detail) not in seen:
            seen.add((v.name, v.detail))
            out.append(v)
    return out


# ---------------------------------------------------------------- C++ / CUDA
_INCLUDE_OK = re.compile(
    r"^(krl_abi\.h|[\w.-]+\.(h|hpp|cuh)|c?math(\.h)?|cstdint|stdint\.h|cstddef|stddef\.h|cstring|string\.h|"
    r"algorithm|numeric|limits|climits|cfloat|float\.h|type_traits|utility|array|vector|cassert|assert\.h|"
    r"initializer_list|tuple|functional|complex|bit|omp\.h|[a-z0-9]*intrin\.h|arm_neon\.h|"
    r"cuda_runtime(_api)?\.h|cuda\.h|cuda_fp16\.h|cuda_bf16\.h|cuda_fp8\.h|mma\.h|cooperative_groups\.h|"
    r"cooperative_groups/[\w/]+\.h|cublas_v2\.h|cublasLt\.h|cudnn\.h|cuda/[\w/]+|cub/[\w/.]+|"
    r"device_launch_parameters\.h|vector_types\.h|math_constants\.h|cuda_pipeline\.h|cuda_awbarrier\.h)$")
_CPP_TORCH = re.compile(r"\b(torch|at|c10|caffe2|pybind11|py)::|\bPyObject\b|\bPy_\w+|\bTORCH_\w+\(|\bAT_\w+\(")
_CPP_TORCH_INC = re.compile(r"^(torch|ATen|c10|caffe2|pybind11|Python|THC|TH)\b")
_CPP_CALLS = {
    THREADS: r"\bstd::(thread|jthread|async)\b|\bpthread_create\b|\bthrd_create\b",
    SIDE_STREAM: r"\bcudaStreamCreate\w*\b|\bcudaStreamPerThread\b|\bcudaStreamBeginCapture\b",
    TIMER_PATCHING: r"\bcudaEvent\w*\b|\bclock_gettime\b|\bgettimeofday\b|\brdtsc\b|std::chrono",
    SANDBOX_ESCAPE: r"\b(system|popen|fork|vfork|execv\w*|execl\w*|dlopen|dlsym|syscall|socket|connect|"
                    r"ptrace|mprotect|mmap|kill|raise|signal|sigaction|setenv|putenv)\s*\(|\b(asm|__asm__|__asm)\b",
    READS_EVALUATOR_FILES: r"\b(fopen|freopen|open|openat|fstream|ifstream|ofstream|opendir|readlink|"
                           r"getenv|getcwd|stat|access)\s*[\(<]|\bstd::(i|o)?fstream\b|\b__FILE__\b",
    OUTPUT_CACHING: r"\b__attribute__\s*\(\(\s*constructor",
    SANDBOX_ESCAPE + ":infra": r"\bkrl_\w+",  # the registry's own names are off limits
}


def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    return re.sub(r'"(\\.|[^"\\])*"', '""', src)  # string literals cannot hide names either


def check_cpp(files: dict[str, str], backend: str) -> list[Violation]:
    """Static checks of kernels/* sources and headers."""
    found: list[Violation] = []
    for path, text in sorted(files.items()):
        if not path.startswith("kernels/"):
            continue
        for m in re.finditer(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', text, flags=re.M):
            inc = m.group(1).strip()
            if _CPP_TORCH_INC.match(inc):
                found.append(Violation(CPP_TORCH, f"{path}: #include <{inc}> (no torch/Python headers in kernels)"))
            elif not _INCLUDE_OK.match(inc) or ".." in inc or inc.startswith("/"):
                found.append(Violation(FORBIDDEN_INCLUDE, f"{path}: #include <{inc}> is not on the allow-list"))
        code = re.sub(r"^\s*#\s*include.*$", "", _strip_comments(text), flags=re.M)
        for m in _CPP_TORCH.finditer(code):
            found.append(Violation(CPP_TORCH, f"{path}: {m.group(0)!r} (no torch/ATen/Python API in kernels)"))
            break
        for name, pat in _CPP_CALLS.items():
            m = re.search(pat, code)
            if m:
                found.append(Violation(name.split(":")[0], f"{path}: {m.group(0).strip()!r} is not allowed in kernels"))
        if backend == "cpu" and re.search(r"__global__|<<<", code):
            found.append(Violation(FORBIDDEN_INCLUDE, f"{path}: CUDA code in a CPU workspace"))
    return _dedupe(found)


def names(violations: list[Violation]) -> list[str]:
    return sorted({v.name for v in violations})
