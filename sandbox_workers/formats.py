"""Solution formats: tell which one a workspace is, and read a KernelBench `load_inline` call without running it.

- ``krl``: kernelrl's own (model_new.py + kernels/ with ``KRL_OP``; skills/infra).
- ``kernelbench``: a model_new.py that builds its kernels with
  ``torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])``
  and no kernels/ folder. The arguments are read with ``ast``: string literals, lists of them, module-level
  names bound once to such values, ``+`` of those; anything computed at run time is refused, so the sources the
  compile worker builds are exactly the ones the candidate's call names.
- ``cuda_agent``: CUDA-Agent's workspace: kernels/*.cu with ``extern "C"`` launchers and
  kernels/*_binding.cpp registering torch-typed wrappers with ``binding_registry.h`` (fixed infrastructure,
  skills/infra/cuda_agent/); model_new.py imports the built module as ``cuda_extension``.
Both foreign formats are built as a torch extension (backends/torchext.py) and judged by binpolicy's
``torchext`` rules; in the candidate process ``load_inline`` / ``import cuda_extension`` return that build.
"""
from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass, field

from sandbox_workers import cuda_agent, guards
from sandbox_workers.workspace import KERNEL_DIR, MODEL_NEW, WorkspaceError

log = logging.getLogger(__name__)

KRL, KERNELBENCH, CUDA_AGENT = "krl", "kernelbench", "cuda_agent"
FORMATS = (KRL, KERNELBENCH, CUDA_AGENT)
CUDA_AGENT_MODULE = "cuda_extension"
_LOADERS = ("load_inline",)
_CPP_EXTENSION = "torch.utils.cpp_extension"
_IGNORED_KW = {"verbose", "with_cuda", "is_python_module", "build_directory", "keep_intermediates",
               "with_pytorch_error_handling", "use_pch", "extra_ldflags"}


class FormatError(WorkspaceError):
    """The solution's format cannot be read statically; the message names the argument and why."""


@dataclass
class InlineSpec:
    """One `load_inline(...)` call, as literal values."""
    name: str
    cpp_sources: list[str] = field(default_factory=list)
    cuda_sources: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    extra_cflags: list[str] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)
    var: str = ""  # the module-level name the call's result is bound to ("" when not bound)


def detect(files: dict[str, str]) -> str:
    """The format of a files dict (model_new.py + kernels/*)."""
    kernels = [p for p in files if p.startswith(KERNEL_DIR + "/")]
    if any(p.endswith("_binding.cpp") for p in kernels):
        return CUDA_AGENT
    src = files.get(MODEL_NEW, "")
    if not kernels and any(n in src for n in _LOADERS) and _CPP_EXTENSION.split(".")[-1] in src:
        return KERNELBENCH
    return KRL


def extract(source: str) -> InlineSpec:
    """The one `load_inline(...)` call of model_new.py, read statically (FormatError when it cannot be)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise FormatError(f"{MODEL_NEW} line {exc.lineno}: {exc.msg}") from None
    consts, calls = _module_constants(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node.func) in _LOADERS:
            calls.append(node)
    if not calls:
        raise FormatError(f"{MODEL_NEW}: no load_inline(...) call found")
    if len(calls) > 1:
        raise FormatError(f"{MODEL_NEW}: {len(calls)} load_inline calls (line "
                          f"{', '.join(str(c.lineno) for c in calls)}); one extension per solution is supported")
    call = calls[0]
    if call.args:
        raise FormatError(f"{MODEL_NEW} line {call.lineno}: load_inline's arguments must be keywords "
                          "(name=, cpp_sources=, cuda_sources=, functions=)")
    kw = {}
    for k in call.keywords:
        if k.arg is None:
            raise FormatError(f"{MODEL_NEW} line {call.lineno}: load_inline(**...) cannot be read statically")
        kw[k.arg] = k.value
    unknown = set(kw) - {"name", "cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags",
                         "extra_include_paths", *_IGNORED_KW}
    if unknown:
        raise FormatError(f"{MODEL_NEW} line {call.lineno}: load_inline argument(s) {sorted(unknown)} not supported")
    if "extra_include_paths" in kw and _strings(kw["extra_include_paths"], consts, "extra_include_paths"):
        raise FormatError(f"{MODEL_NEW} line {call.lineno}: extra_include_paths is not supported (sources only)")
    if "name" not in kw:
        raise FormatError(f"{MODEL_NEW} line {call.lineno}: load_inline needs name=")
    name = _string(kw["name"], consts, "name")
    if not re.fullmatch(r"[A-Za-z_]\w{0,63}", name):
        raise FormatError(f"{MODEL_NEW}: load_inline name={name!r} is not a valid module name")
    spec = InlineSpec(name=name, var=_bound_name(tree, call))
    for arg in ("cpp_sources", "cuda_sources", "functions", "extra_cflags", "extra_cuda_cflags"):
        if arg in kw:
            vals = _strings(kw[arg], consts, arg)
            setattr(spec, arg, [v for v in vals if v.strip()] if arg.startswith("extra") else vals)
    if not spec.cpp_sources:
        raise FormatError(f"{MODEL_NEW}: load_inline needs cpp_sources= (the functions' declarations or code)")
    for fn in spec.functions:
        if not re.fullmatch(r"[A-Za-z_]\w*", fn):
            raise FormatError(f"{MODEL_NEW}: load_inline functions entry {fn!r} is not a C++ function name")
    return spec


def _callee(func: ast.AST) -> str:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _bound_name(tree: ast.Module, call: ast.Call) -> str:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            return stmt.targets[0].id
    return ""


def _module_constants(tree: ast.Module) -> dict[str, ast.AST | None]:
    """Module-level names bound exactly once by a plain assignment (None: bound more than once or otherwise)."""
    out: dict[str, ast.AST | None] = {}
    for stmt in tree.body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] \
            if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            if isinstance(t, ast.Name):
                plain = isinstance(stmt, (ast.Assign, ast.AnnAssign)) and len(targets) == 1 and t.id not in out
                out[t.id] = stmt.value if plain else None
    return out


def _value(node: ast.AST, consts: dict, arg: str, depth: int = 0):
    line = getattr(node, "lineno", "?")
    if depth > 16:
        raise FormatError(f"{MODEL_NEW} line {line}: load_inline {arg}= nests too deeply to read statically")
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_value(e, consts, arg, depth + 1) for e in node.elts]
    if isinstance(node, ast.Name) and consts.get(node.id) is not None:
        return _value(consts[node.id], consts, arg, depth + 1)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _value(node.left, consts, arg, depth + 1), _value(node.right, consts, arg, depth + 1)
        if type(left) is type(right):
            return left + right
    what = f"the name {node.id!r} is not a module-level string constant" if isinstance(node, ast.Name) \
        else f"`{ast.unparse(node)[:80]}` is computed at run time"
    raise FormatError(f"{MODEL_NEW} line {line}: load_inline {arg}= must be a string literal, a list of them or a "
                      f"module-level constant bound once to one: {what}")


def _strings(node: ast.AST, consts: dict, arg: str) -> list[str]:
    v = _value(node, consts, arg)
    vals = [v] if isinstance(v, str) else v
    if not all(isinstance(x, str) for x in vals):
        raise FormatError(f"{MODEL_NEW}: load_inline {arg}= must hold strings only")
    return vals


def _string(node: ast.AST, consts: dict, arg: str) -> str:
    v = _value(node, consts, arg)
    if not isinstance(v, str):
        raise FormatError(f"{MODEL_NEW}: load_inline {arg}= must be one string")
    return v


# ---------------------------------------------------------------- the build's sources
def extension_sources(spec: InlineSpec) -> dict[str, str]:
    """The translation units load_inline itself would write (main.cpp with the pybind11 bindings, cuda.cu)."""
    main = "#include <torch/extension.h>\n" + "\n".join(spec.cpp_sources)
    if spec.functions:
        defs = "".join(f'  m.def("{f}", torch::wrap_pybind_function({f}), "{f}");\n' for f in spec.functions)
        main += f"\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{defs}}}\n"
    out = {f"{KERNEL_DIR}/main.cpp": main}
    if spec.cuda_sources:
        out[f"{KERNEL_DIR}/cuda.cu"] = ("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
                                        + "\n".join(spec.cuda_sources))
    return out


@dataclass
class Plan:
    """What to build for a workspace: the format, the extension's module name, the sources, extra flags."""
    fmt: str
    module: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    cflags: list[str] = field(default_factory=list)
    cuda_cflags: list[str] = field(default_factory=list)


def plan(files: dict[str, str], backend: str) -> Plan:
    """The build plan of a validated workspace (FormatError when a foreign format cannot be read)."""
    fmt = detect(files)
    if fmt == KRL:
        return Plan(KRL, sources={p: t for p, t in files.items() if p.startswith(KERNEL_DIR + "/")})
    if fmt == KERNELBENCH:
        spec = extract(files[MODEL_NEW])
        if spec.cuda_sources and backend != "cuda":
            raise FormatError(f"{MODEL_NEW}: load_inline has cuda_sources; evaluate it with --backend cuda")
        return Plan(KERNELBENCH, spec.name, extension_sources(spec), spec.extra_cflags, spec.extra_cuda_cflags)
    return Plan(CUDA_AGENT, cuda_agent.MODULE, cuda_agent.sources(files, backend))


def check_python(files: dict[str, str]) -> list[guards.Violation]:
    """guards.check_python, with the foreign formats' own loading lines allowed (the cpp_extension import and
    the load_inline call; `import cuda_extension`)."""
    source = files[MODEL_NEW]
    found = guards.check_python(source)
    fmt = detect(files)
    if fmt == KRL or not found:
        return found
    ok_lines: set[int] = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return found
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if all(m in (_CPP_EXTENSION, CUDA_AGENT_MODULE) for m in mods):
                ok_lines.add(node.lineno)
        elif isinstance(node, ast.Call) and _callee(node.func) in _LOADERS:
            ok_lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        elif isinstance(node, ast.Attribute) and node.attr in ("utils", "cpp_extension", *_LOADERS) \
                and ast.unparse(node) in ("torch.utils", _CPP_EXTENSION, f"{_CPP_EXTENSION}.load_inline"):
            ok_lines.add(node.lineno)
    return [v for v in found if _line(v) not in ok_lines]


def _line(v: guards.Violation) -> int:
    m = re.match(r"line (\d+):", v.detail)
    return int(m.group(1)) if m else -1


def check_cpp(files: dict[str, str], backend: str) -> list[guards.Violation]:
    """guards.check_cpp on the sources to build; torch headers and API are the binary policy's call in the
    foreign formats (it reads the built .so: allocation and metadata allowed, compute refused)."""
    p = plan(files, backend)
    theirs = {k: v for k, v in p.sources.items() if not (p.fmt == CUDA_AGENT and cuda_agent.ours(k))}
    found = guards.check_cpp(theirs, backend)
    if p.fmt == KRL:
        return found
    return [v for v in found if v.name != guards.CPP_TORCH
            and not (v.name == guards.FORBIDDEN_INCLUDE and re.search(r"<(binding_registry\.h|cuda_runtime\.h)>",
                                                                      v.detail))
            and not (backend == "cuda" and "CUDA code in a CPU" in v.detail)]
