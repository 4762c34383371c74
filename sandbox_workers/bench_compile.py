"""`kernelrl bench compile`: our cold build and cache hit vs torch's load_inline of the same kernel.

Same run, same machine: the example solution (CUDA when nvcc is found, else CPU; choose with
`kernelrl bench compile cuda|cpu`) is built cold (a unique comment defeats the cache), then
again (cache hit), then the same kernel is built with
`torch.utils.cpp_extension.load_inline` (torch/extension.h binding) in a fresh process and
build folder. Targets: cold <= 0.1x load_inline; cache hit <= 50 ms.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from sandbox_workers import compiler, workspace

EXAMPLES = Path(__file__).resolve().parent.parent / "skills" / "examples"

_LOAD_INLINE = r'''
import json, sys, time
t0 = time.monotonic()
from torch.utils.cpp_extension import load_inline
spec = json.loads(sys.argv[1])
mod = load_inline(name=spec["name"], cpp_sources=[spec["cpp"]], cuda_sources=spec["cuda"] or None,
                  functions=["run"], extra_cflags=["-O3"] + spec["cflags"], extra_cuda_cflags=spec["cuda_flags"],
                  extra_ldflags=spec["ldflags"], with_cuda=bool(spec["cuda"]), build_directory=spec["dir"],
                  verbose=False)
print(json.dumps({"load_inline_s": time.monotonic() - t0}))
'''


def _torch_binding(kernel_src: str, backend: str) -> tuple[str, str]:
    """(cpp, cuda) sources for load_inline: the kernel without KRL_OP, wrapped by a torch binding."""
    src = re.sub(r"^\s*KRL_OP\(.*$", "", kernel_src, flags=re.M).replace('#include "krl_abi.h"', "")
    if backend == "cuda":
        wrapper = ("#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n" + src +
                   "\ntorch::Tensor run(torch::Tensor x) { auto y = torch::empty_like(x);\n"
                   "  relu_f32(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(),"
                   " at::cuda::getCurrentCUDAStream());\n  return y; }\n")
        return "torch::Tensor run(torch::Tensor x);", wrapper
    cpp = ("#include <torch/extension.h>\n" + src +
           "\ntorch::Tensor run(torch::Tensor x) { auto y = torch::empty_like(x);\n"
           "  relu_f32(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());\n  return y; }\n")
    return cpp, ""


def _unversioned_cudart(home: Path, tmp: Path) -> list[str]:
    """PyPI CUDA wheels ship only libcudart.so.13; load_inline links -lcudart: give it a symlink."""
    from sandbox_workers.backends.cuda import _lib_dir

    libdir = _lib_dir(home)
    if (libdir / "libcudart.so").exists():
        return []
    versioned = sorted(libdir.glob("libcudart.so.*"))
    if not versioned:
        return []
    link = tmp / "cudart-link"
    link.mkdir()
    (link / "libcudart.so").symlink_to(versioned[0])
    return [f"-L{link}", f"-Wl,-rpath,{libdir}"]


def run_bench(args, cfg) -> dict:
    from sandbox_workers.backends.cuda import cuda_home

    rest = list(getattr(args, "rest", []) or [])
    backend = rest[0] if rest and rest[0] in ("cpu", "cuda") else ("cuda" if cuda_home() else "cpu")
    example = EXAMPLES / f"{backend}_19_relu"
    files = workspace.read_dir(example)
    kernel_path = next(p for p in files if p.startswith("kernels/"))
    salted = dict(files)
    salted[kernel_path] = files[kernel_path] + f"\n// bench {uuid.uuid4().hex}\n"
    t0 = time.monotonic()
    cold = compiler.compile_workspace(salted, backend, cfg)
    cold_s = time.monotonic() - t0
    if not cold.ok:
        return {"error": f"cold build failed: {cold.error}\n{cold.log}"}
    hits = []
    for _ in range(5):
        t0 = time.monotonic()
        hit = compiler.compile_workspace(salted, backend, cfg)
        hits.append(time.monotonic() - t0)
        assert hit.cached
    cpp, cuda = _torch_binding(files[kernel_path], backend)
    arch = (cfg.sandbox.cuda_arch or "90").split(",")[0].strip()
    env = dict(os.environ)
    env.pop("TORCH_EXTENSIONS_DIR", None)
    home = cuda_home()
    if backend == "cuda" and home:
        env.setdefault("CUDA_HOME", str(home))
    with tempfile.TemporaryDirectory(prefix="krl-bench-li-") as d:
        ldflags = _unversioned_cudart(home, Path(d)) if backend == "cuda" and home else []
        spec = {"name": f"krl_bench_{uuid.uuid4().hex[:8]}", "cpp": cpp, "cuda": cuda, "dir": d, "ldflags": ldflags,
                "cflags": ["-fopenmp"] if backend == "cpu" else [],
                "cuda_flags": ["-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}"]}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-c", _LOAD_INLINE, json.dumps(spec)], capture_output=True, text=True,
                           env=env, timeout=1800)
        li_wall = time.monotonic() - t0
    out = {"backend": backend, "example": example.name, "cold_s": cold_s, "cold_build_s": cold.duration_s,
           "cache_hit_s": sorted(hits)[len(hits) // 2], "cache_hit_max_s": max(hits),
           "network_isolated": cold.network_isolated}
    if r.returncode != 0:
        out["load_inline_error"] = (r.stderr or r.stdout)[-3000:]
        return out
    out["load_inline_s"] = li_wall
    out["cold_over_load_inline"] = cold_s / li_wall
    out["targets"] = {"cold_le_0.1x_load_inline": cold_s <= 0.1 * li_wall, "cache_hit_le_50ms": out["cache_hit_s"] <= 0.05}
    return out
