"""CUDA-Agent workspaces: kernels/*.cu (extern "C" launchers) + kernels/*_binding.cpp, built as `cuda_extension`.

The fixed infrastructure (skills/infra/cuda_agent/: binding_registry.h, binding.cpp) is always ours: copies a
workspace carries are ignored. Each *_binding.cpp registers torch-typed wrappers with REGISTER_BINDING; the
one PYBIND11_MODULE in binding.cpp applies them, so no static constructor is needed (binpolicy refuses those).
"""
from __future__ import annotations

import logging
from pathlib import Path

from sandbox_workers.workspace import KERNEL_DIR, WorkspaceError

log = logging.getLogger(__name__)
INFRA = Path(__file__).resolve().parents[1] / "skills" / "infra" / "cuda_agent"
FIXED = ("binding_registry.h", "binding.cpp")
GENERATED = "krl_bindings_list.h"  # written by sources(): the registration calls binding.cpp makes
MODULE = "cuda_extension"


def sources(files: dict[str, str], backend: str) -> dict[str, str]:
    """The sources to build for a CUDA-Agent workspace: its kernels plus our fixed binding infrastructure."""
    if backend != "cuda":
        raise WorkspaceError("CUDA-Agent workspace (kernels/*_binding.cpp): evaluate it with --backend cuda")
    out = {p: t for p, t in files.items() if p.startswith(KERNEL_DIR + "/") and p.split("/")[-1] not in FIXED}
    bindings = sorted(p for p in out if p.endswith("_binding.cpp"))
    for name in FIXED:
        out[f"{KERNEL_DIR}/{name}"] = (INFRA / name).read_text()
    # every binding file's registration function is called from binding.cpp's module init (generated list)
    regs = [p.split("/")[-1].removesuffix("_binding.cpp") for p in bindings]
    out[f"{KERNEL_DIR}/{GENERATED}"] = "".join(f"KRL_BINDING_FN({r})\n" for r in regs)
    return out


def ours(path: str) -> bool:
    """A source of the build that is our infrastructure, not the workspace's (the text rules skip it: it uses the
    registry's own names, which a workspace may not)."""
    return path in {f"{KERNEL_DIR}/{name}" for name in (*FIXED, GENERATED)}  # exactly the paths sources() writes
