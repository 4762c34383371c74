"""Convert solutions between kernelrl's KRL_OP format and KernelBench's load_inline format.

krl -> kernelbench: the kernel sources go verbatim into cpp_sources/cuda_sources (``#include "krl_abi.h"``
replaced by a prelude defining KRL_OP as nothing), one torch-typed wrapper per KRL_OP is generated and bound
with ``functions=[...]``, and model_new.py's ``krl.ops()`` becomes an object whose methods are those wrappers.
The original files ride along as string constants, so kernelbench -> krl restores them exactly. A native
KernelBench solution (C++ taking torch::Tensor) has no mechanical krl form: that is refused with the reason.
"""
from __future__ import annotations

import ast
import logging
import re

from sandbox_workers import formats
from sandbox_workers.workspace import MODEL_NEW, WorkspaceError

log = logging.getLogger(__name__)
_PRELUDE = "#include <cstdint>\n#define KRL_OP(fn, sig)\n"
_CTYPES = {"f32": "float", "f64": "double", "f16": "at::Half", "bf16": "at::BFloat16", "i8": "int8_t",
           "u8": "uint8_t", "i16": "int16_t", "i32": "int32_t", "i64": "int64_t", "bool": "bool"}


def to_kernelbench(files: dict[str, str], backend: str = "cpu") -> dict[str, str]:
    kernels = {p: t for p, t in sorted(files.items()) if p.startswith("kernels/")}
    if formats.detect(files) != formats.KRL or not kernels:
        raise WorkspaceError("convert --to kernelbench: the source is not a kernelrl (KRL_OP) solution")
    ops = [(m.group(1), m.group(2)) for t in kernels.values()
           for m in re.finditer(r'^\s*KRL_OP\(\s*(\w+)\s*,\s*"([^"]*)"\s*\)', t, re.M)]
    if not ops:
        raise WorkspaceError("convert --to kernelbench: no KRL_OP registrations in kernels/")
    cpp, cuda = [], []
    for path, text in kernels.items():
        body = f"// {path}\n" + re.sub(r'^\s*#\s*include\s*"krl_abi\.h"\s*$', _PRELUDE, text, flags=re.M)
        if path.endswith((".h", ".hpp", ".cuh")):
            raise WorkspaceError(f"convert --to kernelbench: {path}: local headers are not supported "
                                 "(load_inline takes source strings only)")
        (cuda if path.endswith(".cu") else cpp).append(body)
    decls = [f'extern "C" void {fn}({_c_params(sig)});' for fn, sig in ops] if cuda else []
    wrappers = "\n".join(decls + [_wrapper(fn, sig) for fn, sig in ops])
    names = [f"{fn}_t" for fn, _ in ops]
    model = files[MODEL_NEW]
    new = model.replace("import krl\n", "from torch.utils.cpp_extension import load_inline\n", 1)
    new = re.sub(r"\bkrl\.ops\(\)", "_KrlOps()", new)
    new = re.sub(r"\bkrl\.device\(\)", repr(backend), new)
    if re.search(r"\bkrl\b", new):
        raise WorkspaceError("convert --to kernelbench: model_new.py uses krl beyond krl.ops()/krl.device()")
    consts = "".join(f"KRL_FILE_{i} = {text!r}\n" for i, text in enumerate(kernels.values()))
    consts += f"KRL_PATHS = {chr(10).join(kernels)!r}\n"
    ext = (f"\n{consts}KRL_MODEL_NEW = {model!r}\n"
           f"_ext = load_inline(name=\"krl_converted\", cpp_sources={[*cpp, wrappers]!r},\n"
           f"                   cuda_sources={cuda!r}, functions={names!r})\n\n\n"
           "class _KrlOps:\n" + "".join(f"    {fn} = staticmethod(_ext.{fn}_t)\n" for fn, _ in ops) + "\n")
    head, sep, rest = new.partition("\nclass ")
    first_use = head.find("_KrlOps()")
    if first_use >= 0:  # the wrappers must exist before `ops = _KrlOps()`
        cut = head.rfind("\n", 0, first_use) + 1
        head = head[:cut] + ext + head[cut:]
        return {MODEL_NEW: head + sep + rest}
    return {MODEL_NEW: head + ext + sep + rest}


def _c_params(sig: str) -> str:
    out = []
    for i, raw in enumerate(p.strip() for p in sig.split(",") if p.strip()):
        words = raw.replace("*", " * ").split()
        const = words[0] == "const"
        words = words[1:] if const else words
        if words[0] == "stream":
            out.append("void* stream")
        elif len(words) > 1 and words[1] == "*":
            out.append(f"{'const ' if const else ''}{_CTYPES[words[0]]}* a{i}")
        else:
            out.append(f"{_CTYPES[words[0]]} a{i}")
    return ", ".join(out)


def _wrapper(fn: str, sig: str) -> str:
    params, args = [], []
    for i, raw in enumerate(p.strip() for p in sig.split(",") if p.strip()):
        words = raw.replace("*", " * ").split()
        words = words[1:] if words[0] == "const" else words
        if words[0] == "stream":
            args.append("(void*)at::cuda::getCurrentCUDAStream().stream()")
        elif len(words) > 1 and words[1] == "*":
            params.append(f"torch::Tensor a{i}")
            args.append(f"({_CTYPES[words[0]]}*)a{i}.data_ptr()")
        else:
            params.append(f"{'double' if words[0] in ('f32', 'f64') else 'int64_t'} a{i}")
            args.append(f"({_CTYPES[words[0]]})a{i}")
    return f"void {fn}_t({', '.join(params)}) {{ {fn}({', '.join(args)}); }}"


def to_krl(files: dict[str, str]) -> dict[str, str]:
    if formats.detect(files) != formats.KERNELBENCH:
        raise WorkspaceError("convert --to krl: the source is not a KernelBench load_inline solution")
    tree = ast.parse(files[MODEL_NEW])
    consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    if "KRL_MODEL_NEW" not in consts:
        raise WorkspaceError("convert --to krl: not mechanical for a native KernelBench solution: its C++ functions "
                             "take torch::Tensor and call the torch API, while kernelrl's ABI needs extern \"C\" "
                             "kernels on raw pointers registered with KRL_OP; rewrite the kernels (skills/infra)")
    paths = consts.get("KRL_PATHS", "").split("\n")
    out = {MODEL_NEW: consts["KRL_MODEL_NEW"]}
    for i, path in enumerate(p for p in paths if p):
        if f"KRL_FILE_{i}" not in consts:
            raise WorkspaceError(f"convert --to krl: KRL_FILE_{i} (the text of {path}) is missing from model_new.py")
        out[path] = consts[f"KRL_FILE_{i}"]
    return out
