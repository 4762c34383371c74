"""Build a torch extension (KernelBench load_inline, CUDA-Agent) in the build sandbox, with a cached PCH.

Flags are torch.utils.cpp_extension's (torch + Python include dirs, ``-DTORCH_EXTENSION_NAME``,
``-DTORCH_API_INCLUDE_EXTENSION_H``, C++20, -fPIC; link c10/torch/torch_cpu/torch_python, + c10_cuda/
torch_cuda/cudart on CUDA) plus the backend's own (sandbox.cpu_flags, sandbox.cuda_arch). The precompiled
header of ``torch/extension.h`` is built once per (torch, compiler, flags) under
``<sandbox.pch_cache_dir>/<key>/`` (default ``<artifact cache>/pch``; in the build sandbox, then renamed into
place) and bound read-only into every later build; GCC ignores a PCH whose flags differ (``-Winvalid-pch`` says so
in the log).
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox_workers.backends.base import LIBRARY_NAME, BuildOutput, check_flags, run_ninja, tool_version

log = logging.getLogger(__name__)
PCH_HEADER = "krl_torch_pch.h"
_QUERY = ("import json, sysconfig, torch, torch.utils.cpp_extension as c; print(json.dumps({'inc': c.include_paths(),"
          " 'lib': c.library_paths(), 'py': sysconfig.get_paths()['include'], 'version': torch.__version__,"
          " 'abi': int(torch._C._GLIBCXX_USE_CXX11_ABI)}))")


@functools.lru_cache(maxsize=1)
def torch_paths() -> dict:
    """torch's include/library folders and ABI, asked of a child interpreter (this process stays torch-free)."""
    out = subprocess.run([sys.executable, "-c", _QUERY], capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise FileNotFoundError(f"torch extension flags unavailable: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def host_flags(cfg, extra: list[str]) -> list[str]:
    """g++ flags of every TU of the extension (no TORCH_EXTENSION_NAME: the PCH is shared across names)."""
    tp = torch_paths()
    # like load_inline: the optimisation level is the solution's extra_cflags (none: -O0); the host's -march and
    # OpenMP stay (sandbox.cpu_flags)
    flags = [f for f in shlex.split(cfg.sandbox.cpu_flags) if not f.startswith(("-std=", "-O"))]
    flags += ["-fPIC", "-std=c++20", "-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={tp['abi']}",
              *[f"-isystem{p}" for p in tp["inc"]], f"-isystem{tp['py']}", *check_flags(list(extra))]
    return [f for f in flags if not f.startswith("-l")]


def pch_key(flags: list[str]) -> str:
    doc = {"torch": torch_paths()["version"], "gxx": tool_version("g++"), "flags": flags}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


def ensure_pch(cfg, flags: list[str], root: Path) -> tuple[Path | None, str]:
    """The folder holding PCH_HEADER(.gch) for these flags, built now when missing (None + log on failure)."""
    dest = root / pch_key(flags)
    if (dest / (PCH_HEADER + ".gch")).is_file():
        return dest, ""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)  # one builder per key; the others wait for it
        if (dest / (PCH_HEADER + ".gch")).is_file():
            return dest, ""
        t0 = time.monotonic()
        work = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
        (work / PCH_HEADER).write_text("#pragma once\n#include <torch/extension.h>\n")
        (work / "build.ninja").write_text(
            "ninja_required_version = 1.3\nrule pch\n  command = g++ " + " ".join(shlex.quote(f) for f in flags)
            + f" -x c++-header $in -o $out\nbuild {PCH_HEADER}.gch: pch {PCH_HEADER}\n")
        # trusted input (torch's headers, checked flags); a torch PCH is ~0.8 GB: above the kernels' file limit
        out = run_ninja(work, cfg, 1, file_size_mb=4096, target=PCH_HEADER + ".gch",
                        wall_s=max(600.0, cfg.sandbox.compile_timeout_s))  # once per key, on a loaded host slow
        if not out.ok:
            shutil.rmtree(work, ignore_errors=True)
            log.warning("precompiled header failed (%s): %s", out.error, out.log[-500:])
            return None, out.log
        (work / "build.ninja").unlink()
        os.chmod(work, 0o755)
        os.rename(work, dest)
        log.info("built the torch precompiled header %s in %.1f s", dest.name, time.monotonic() - t0)
    return dest, ""


class TorchExtBuilder:
    """Sources of a formats.Plan -> one torch extension module named plan.module (stored as LIBRARY_NAME)."""

    def __init__(self, backend: str):
        self.backend = backend

    def toolchain_id(self) -> str:
        from sandbox_workers.backends import get_builder
        return f"torchext:{get_builder(self.backend).toolchain_id()} | py{sys.version.split()[0]}"

    def ninja_file(self, plan, cfg, pch: Path | None) -> str:
        tp = torch_paths()
        cflags = host_flags(cfg, plan.cflags) + [f"-DTORCH_EXTENSION_NAME={plan.module}"]
        if pch is not None:
            cflags += ["-include", str(pch / PCH_HEADER), "-Winvalid-pch"]
        cuda = any(p.endswith(".cu") for p in plan.sources)
        home = None
        if cuda:  # a C++ binding may include c10/cuda headers, which include the toolkit's (cpp_extension's CUDA paths)
            from sandbox_workers.toolchain import cuda_home
            home = cuda_home()
            cflags += [f"-isystem{home / 'include'}"] if home is not None else []
        libs = ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
        ldflags = ["-shared", "-fopenmp", *[f"-L{p}" for p in tp["lib"]]]
        lines = ["ninja_required_version = 1.3", f"cflags = {' '.join(shlex.quote(f) for f in cflags)}",
                 "rule cxx", "  command = g++ $cflags -MMD -MF $out.d -c $in -o $out", "  depfile = $out.d"]
        if cuda:
            lines += self._cuda_rules(plan, cfg)
            libs += ["-lc10_cuda", "-ltorch_cuda"]
            from sandbox_workers.backends.cuda import _lib_dir, _lib_flag
            libdir = _lib_dir(home)
            ldflags += [f"-L{libdir}", f"-Wl,-rpath,{libdir}", _lib_flag(libdir, "-lcudart")]
        lines += [f"ldflags = {' '.join(shlex.quote(f) for f in ldflags + libs)}", "rule link",
                  "  command = g++ $in -o $out $ldflags"]
        objs = []
        for src in sorted(p for p in plan.sources if p.endswith((".cpp", ".cc", ".cu"))):
            obj = "obj/" + src.replace("/", "_") + ".o"
            objs.append(obj)
            lines.append(f"build {obj}: {'nvcc' if src.endswith('.cu') else 'cxx'} {src}")
        lines.append(f"build {LIBRARY_NAME}: link {' '.join(objs)}")
        return "\n".join(lines) + "\n"

    def _cuda_rules(self, plan, cfg) -> list[str]:
        from sandbox_workers.toolchain import cuda_home
        home = cuda_home()
        if home is None:
            raise FileNotFoundError("nvcc not found: set CUDA_HOME or install the CUDA toolkit")
        tp = torch_paths()
        arches = [a.strip() for a in (cfg.sandbox.cuda_arch or "90").split(",") if a.strip()]
        gencode = [x for a in arches for x in ("-gencode", f"arch=compute_{a},code=sm_{a}")]
        user = [f for f in check_flags(list(plan.cuda_cflags)) if not f.startswith(("-l", "-m"))]
        nvflags = ["-O3", "-std=c++20", "--compiler-options", "-fPIC", f"-DTORCH_EXTENSION_NAME={plan.module}",
                   "-DTORCH_API_INCLUDE_EXTENSION_H", f"-D_GLIBCXX_USE_CXX11_ABI={tp['abi']}",
                   "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__", "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
                   "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr", "-Ikernels",
                   *[f"-isystem={p}" for p in tp["inc"]], f"-isystem={tp['py']}", f"-I{home / 'include'}",
                   *gencode, *user]
        return [f"nvcc = {shlex.quote(str(home / 'bin' / 'nvcc'))}",
                f"nvflags = {' '.join(shlex.quote(f) for f in nvflags)}",
                "rule nvcc", "  command = $nvcc $nvflags -MD -MF $out.d -c $in -o $out", "  depfile = $out.d"]

    def build(self, plan, work: Path, cfg, pch_root: Path | None) -> BuildOutput:
        """Write the plan's sources into `work`, build them sandboxed (the PCH folder bound read-only)."""
        for rel, text in plan.sources.items():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
        pch, pch_log = (None, "")
        if pch_root is not None:
            pch, pch_log = ensure_pch(cfg, host_flags(cfg, plan.cflags), pch_root)
        (work / "build.ninja").write_text(self.ninja_file(plan, cfg, pch))
        jobs = max(1, min(len(plan.sources), cfg.sandbox.compile_jobs))
        out = run_ninja(work, cfg, jobs, rlimit_as=self.backend == "cpu",
                        ro_binds=[(str(pch), str(pch))] if pch is not None else ())
        if pch is None and pch_log:
            out.log = ("(precompiled header unavailable, built without it)\n" + out.log).strip()
        return out
