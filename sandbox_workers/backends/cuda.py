"""CUDA backend: nvcc for .cu, g++ for .cpp, one library; CUDA-event timing after an L2 flush.

Toolkit discovery: $CUDA_HOME, `nvcc` on PATH, /usr/local/cuda, or the PyPI
wheels (nvidia-cuda-nvcc and header packages under site-packages/nvidia/cu13).
The library links cudart dynamically (and cuBLAS/cuDNN when asked by flag).
"""
from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path

from sandbox_workers.backends.base import INFRA_SOURCES, LIBRARY_NAME, Builder, Runtime, tool_version
from sandbox_workers.backends.cpu import cpu_model
from sandbox_workers.binpolicy import inspect_library
from sandbox_workers.toolchain import cuda_home  # re-exported


def _lib_dir(home: Path) -> Path:
    for name in ("lib64", "lib", "targets/x86_64-linux/lib"):
        if (home / name).is_dir():
            return home / name
    return home / "lib"


def _lib_flag(libdir: Path, flag: str) -> str:
    """-lNAME, or -l:libNAME.so.<major> when only the versioned library exists (PyPI wheels)."""
    name = flag[2:]
    if (libdir / f"lib{name}.so").exists():
        return flag
    versioned = sorted(libdir.glob(f"lib{name}.so.*"), key=lambda p: len(p.name))
    return f"-l:{versioned[0].name}" if versioned else flag


class CudaBuilder(Builder):
    name = "cuda"

    def auto_libs(self, files: dict[str, str]) -> list[str]:
        text = "\n".join(files.values())
        libs = []
        if re.search(r"#\s*include\s*[<\"]cublas(_v2|Lt)?\.h", text):
            libs += ["-lcublas", "-lcublasLt"]
        if re.search(r"#\s*include\s*[<\"]cudnn\.h", text):
            libs.append("-lcudnn")
        return libs

    def inspect(self, library: Path, libs: list[str] = ()) -> list:
        """The binary policy (binpolicy.py) with the CUDA allow-list; cuBLAS/cuDNN symbols only when linked."""
        return inspect_library(library, "cuda", libs)

    def toolchain_id(self) -> str:
        home = cuda_home()
        nvcc = str(home / "bin" / "nvcc") if home else "nvcc"
        return f"{tool_version(nvcc)} | {tool_version('g++')}"

    def ninja_file(self, sources: list[str], extra_flags: list[str], cfg) -> str:
        home = cuda_home()
        if home is None:
            raise FileNotFoundError("nvcc not found: set CUDA_HOME or install the CUDA toolkit "
                                    "(pip install nvidia-cuda-nvcc nvidia-cuda-runtime)")
        arches = [a.strip() for a in (cfg.sandbox.cuda_arch or "90").split(",") if a.strip()]
        gencode = []
        for a in arches:
            gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
        gencode += ["-gencode", f"arch=compute_{arches[-1]},code=compute_{arches[-1]}"]  # PTX for newer GPUs
        libs = [f for f in extra_flags if f.startswith("-l")]
        user = [f for f in extra_flags if not f.startswith("-l")]
        # host -m flags go to g++ only; nvcc's -O is the host code's alone (nvcc has no -Os), and at -O0 nvcc's
        # registration code calls through function pointers at load time, which binpolicy.py refuses
        nv_user = [f for f in user if not f.startswith("-m") and f not in ("-O0", "-Os")]
        inc = f"-I{home / 'include'}"
        nvflags = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC,-fvisibility=hidden", "-Iinfra", "-Ikernels", inc,
                   *gencode, *nv_user]
        host_user = [f for f in user if not f.startswith(("--", "-lineinfo", "-maxrregcount", "-Xptxas"))]  # nvcc's
        cflags = ["-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-Iinfra", "-Ikernels", inc, *host_user]
        libdir = _lib_dir(home)
        # g++ links, not nvcc (whose default is -cudart static): libcudart stays a shared library, so the
        # library's undefined symbols are exactly the CUDA API it calls (checked by binpolicy.py)
        ldflags = ["-shared", f"-L{libdir}", f"-Wl,-rpath,{libdir}", *(_lib_flag(libdir, f) for f in ["-lcudart", *libs])]
        lines = [
            "ninja_required_version = 1.3",
            f"nvcc = {shlex.quote(str(home / 'bin' / 'nvcc'))}",
            f"nvflags = {' '.join(shlex.quote(f) for f in nvflags)}",
            f"cflags = {' '.join(shlex.quote(f) for f in cflags)}",
            f"ldflags = {' '.join(shlex.quote(f) for f in ldflags)}",
            "rule nvcc",
            "  command = $nvcc $nvflags -MD -MF $out.d -c $in -o $out",
            "  depfile = $out.d",
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
            lines.append(f"build {obj}: {'nvcc' if src.endswith('.cu') else 'cxx'} {src}")
        lines.append(f"build {LIBRARY_NAME}: link {' '.join(objs)}")
        return "\n".join(lines) + "\n"


class CudaRuntime(Runtime):
    """CUDA events on the current stream, an L2-sized buffer zeroed before each trial.

    The events measure GPU time, not the host's launch path: no synchronise between
    the flush and the start event, plus a GPU spin of `lead_us` queued after the
    flush, so the host enqueues the call (Python forward, argument checks, dynamo's
    guards for the torch.compile baseline) while the GPU is still busy. Measured on
    the H200 (docs/oracle-gpu.md): with a synchronise there, a 0.17 ms kernel's
    within-run CV was 0.13-0.19 (host jitter of the Python call); flush-only
    overlap left a bimodal tail whenever the host path outlasted the ~70 us flush.
    Short calls are timed as a batch of back-to-back launches per trial (set by
    Runtime.time_callable). Each trial also records host wall time between two full
    device synchronisations, less the flush + spin's own time; `wall_over_event`
    compares the two so work hidden on another stream (event time << wall time) is
    caught.
    """

    device = "cuda"

    def __init__(self, flush_mb: int = 256, threads: int = 0, lead_us: int = 200):
        import torch

        self._torch = torch
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA backend: no usable GPU in this process")
        self.flush_bytes = max(1, flush_mb) * 1024 * 1024
        self._buf = torch.empty(self.flush_bytes // 4, dtype=torch.float32, device="cuda")
        self._Event = torch.cuda.Event
        self._sync = torch.cuda.synchronize
        self._clock = time.perf_counter
        self.wall_over_event: list[float] = []
        # ~2 GHz SM clock on Hopper: cycles per microsecond of lead (an unlocked, idle clock spins longer)
        self._spin = getattr(torch.cuda, "_sleep", None)  # torch's own spin kernel (cycles)
        self.lead_cycles = max(0, int(lead_us)) * 2000 if self._spin is not None else 0
        self.flush_s = self._time_flush()

    def _time_flush(self) -> float:
        """Median host wall time of sync + flush (+ spin) + sync, subtracted from each trial's wall time."""
        samples = []
        for _ in range(12):  # the first ones run while the SM clock ramps up from idle: dropped
            self._sync()
            t0 = self._clock()
            self.flush()
            self._sync()
            samples.append(self._clock() - t0)
        return sorted(samples[5:])[3]

    def sync(self) -> None:
        self._sync()

    def flush(self) -> None:
        self._buf.zero_()
        if self.lead_cycles:
            self._spin(self.lead_cycles)

    def time_batch(self, fn, batch: int) -> float:
        start, end = self._Event(enable_timing=True), self._Event(enable_timing=True)
        self._sync()
        w0 = self._clock()
        self.flush()  # no sync here: the host enqueues the call while the GPU flushes
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        self._sync()
        wall = self._clock() - w0 - self.flush_s
        ev = start.elapsed_time(end) / 1000.0
        if ev > 0:
            self.wall_over_event.append(max(wall, 0.0) / ev)
        return ev

    def device_name(self) -> str:
        return self._torch.cuda.get_device_name()

    def clock_info(self) -> dict:
        info = {"flush_bytes": self.flush_bytes, "flush_s": self.flush_s, "lead_cycles": self.lead_cycles,
                "host_cpu": cpu_model()}
        try:
            import pynvml

            pynvml.nvmlInit()
            h = _nvml_handle(pynvml)
            info.update(uuid=pynvml.nvmlDeviceGetUUID(h),
                        torch_uuid=str(self._torch.cuda.get_device_properties(0).uuid),
                        sm_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                        mem_clock_mhz=pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
        except Exception as exc:  # noqa: BLE001 - NVML is optional evidence
            info["nvml_error"] = str(exc)
        return info


def _nvml_handle(pynvml):
    """The NVML handle of the GPU this process uses (NVML ignores CUDA_VISIBLE_DEVICES: resolve the pin)."""
    pinned = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if pinned.startswith("GPU-"):
        return pynvml.nvmlDeviceGetHandleByUUID(pinned)
    return pynvml.nvmlDeviceGetHandleByIndex(int(pinned) if pinned.isdigit() else 0)
