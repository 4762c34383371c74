"""Where the CUDA toolkit is: found once, by the builders and by the sandbox (which mounts it read-only).

Toolkit discovery: $CUDA_HOME/$CUDA_PATH, `nvcc` on PATH, /usr/local/cuda, or the PyPI wheels
(nvidia-cuda-nvcc and header packages under site-packages/nvidia/cu13). Standard library only, so
the OS sandbox can ask without importing a backend.
"""
from __future__ import annotations

import functools
import os
import shutil
import site
from pathlib import Path


@functools.lru_cache(maxsize=1)
def cuda_home() -> Path | None:
    """The CUDA toolkit root holding bin/nvcc, include/ and lib(64)/."""
    cands = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cands.append(Path(os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(Path(nvcc).resolve().parent.parent)
    cands.append(Path("/usr/local/cuda"))
    for sp in site.getsitepackages():
        cands += [Path(sp) / "nvidia" / "cu13", Path(sp) / "nvidia" / "cuda_nvcc"]
    for c in cands:
        if (c / "bin" / "nvcc").is_file():
            return c
    return None
