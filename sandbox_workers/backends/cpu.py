"""CPU backend: g++ -O3 -fopenmp kernels; monotonic-clock timing after an LLC flush."""
from __future__ import annotations

import functools
import os
import platform
import shlex
import time
from pathlib import Path

from sandbox_workers.backends.base import INFRA_SOURCES, LIBRARY_NAME, Builder, Runtime, tool_version
from sandbox_workers.binpolicy import inspect_library, writable_symbols  # noqa: F401 - re-exported


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def llc_bytes() -> int:
    """Size of the last-level cache (largest index under sysfs), 32 MiB if unknown."""
    best = 0
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in base.glob("index*"):
        try:
            txt = (idx / "size").read_text().strip()
        except OSError:
            continue
        mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(txt[-1:], 1)
        num = txt[:-1] if txt[-1:] in "KMG" else txt
        if num.isdigit():
            best = max(best, int(num) * mult)
    return best or 32 * 1024 ** 2


class CpuBuilder(Builder):
    name = "cpu"

    def toolchain_id(self) -> str:
        # -march=native makes the artifact specific to this CPU model.
        return f"{tool_version('g++')} | {cpu_model()}"

    def inspect(self, library: Path, libs: list[str] = ()) -> list:
        """The binary policy (binpolicy.py): symbols, load-time code, writable state, raw syscalls."""
        return inspect_library(library, "cpu", libs)

    def ninja_file(self, sources: list[str], extra_flags: list[str], cfg) -> str:
        cflags = shlex.split(cfg.sandbox.cpu_flags) + ["-fPIC", "-fvisibility=hidden", "-Iinfra", "-Ikernels"]
        cflags += extra_flags
        ldflags = ["-shared", "-fopenmp"] + [f for f in extra_flags if f.startswith("-l")]
        cflags = [f for f in cflags if not f.startswith("-l")]
        lines = [
            "ninja_required_version = 1.3",
            f"cflags = {' '.join(shlex.quote(f) for f in cflags)}",
            f"ldflags = {' '.join(shlex.quote(f) for f in ldflags)}",
            "rule cxx",
            "  command = g++ $cflags -MMD -MF $out.d -c $in -o $out",
            "  depfile = $out.d",
            "rule link",
            "  command = g++ $in -o $out $ldflags",
        ]
        objs = []
        for src in sources + [f"infra/{s}" for s in INFRA_SOURCES]:
            obj = "obj/" + src.replace("/", "_") + ".o"
            objs.append(obj)
            lines.append(f"build {obj}: cxx {src}")
        lines.append(f"build {LIBRARY_NAME}: link {' '.join(objs)}")
        return "\n".join(lines) + "\n"


class CpuRuntime(Runtime):
    """Timing on the host CPU: monotonic clock, a buffer larger than the LLC written before each trial."""

    device = "cpu"

    def __init__(self, flush_mb: int = 0, threads: int = 0):
        import torch

        self._torch = torch
        if threads > 0:
            torch.set_num_threads(threads)
        size = flush_mb * 1024 * 1024 if flush_mb > 0 else min(2 * llc_bytes(), 512 * 1024 ** 2)
        self.flush_bytes = size
        self._buf = torch.empty(size // 4, dtype=torch.float32)
        self._tick = 0
        self._clock = time.perf_counter  # monotonic; bound now so later patching cannot reach it

    def flush(self) -> None:
        self._tick += 1
        self._buf.fill_(float(self._tick))

    def time_batch(self, fn, batch: int) -> float:
        self.flush()
        clock = self._clock
        t0 = clock()
        for _ in range(batch):
            fn()
        return clock() - t0

    def device_name(self) -> str:
        return cpu_model()

    def clock_info(self) -> dict:
        return {"threads": self._torch.get_num_threads(), "flush_bytes": self.flush_bytes,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
