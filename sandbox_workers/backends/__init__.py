"""Device backends of the oracle: each knows how to build kernels and how to time a call.

``get_builder(name)`` (worker side, no torch import) and ``get_runtime(name)``
(inside the sandboxed child, imports torch) are the whole interface; see
``base.py``. Backends: ``cpu`` (g++ + OpenMP, monotonic clock) and ``cuda``
(nvcc, CUDA events).
"""
from __future__ import annotations

from sandbox_workers.backends.base import Builder, BuildOutput, Runtime

BACKENDS = ("cpu", "cuda")


def get_builder(name: str) -> Builder:
    if name == "cpu":
        from sandbox_workers.backends.cpu import CpuBuilder
        return CpuBuilder()
    if name == "cuda":
        from sandbox_workers.backends.cuda import CudaBuilder
        return CudaBuilder()
    raise ValueError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")


def get_runtime(name: str, **kwargs) -> Runtime:
    if name == "cpu":
        from sandbox_workers.backends.cpu import CpuRuntime
        return CpuRuntime(**kwargs)
    if name == "cuda":
        from sandbox_workers.backends.cuda import CudaRuntime
        return CudaRuntime(**kwargs)
    raise ValueError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})")


__all__ = ["BACKENDS", "Builder", "BuildOutput", "Runtime", "get_builder", "get_runtime"]
