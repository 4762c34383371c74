"""The solution workspace: which files a request may carry, and their validation.

Layout (skills/SKILL.md teaches it): ``model_new.py`` (class ModelNew) and
``kernels/`` with C++ (``.cpp``, CPU backend) or CUDA (``.cu`` + ``.cpp``)
sources and local headers. ``model.py`` is the reference and is never taken
from the request's files.
"""
from __future__ import annotations

import posixpath
from pathlib import Path

from cluster.errors import KernelRLError

MODEL_NEW = "model_new.py"
KERNEL_DIR = "kernels"
SOURCE_EXTS = {"cpu": (".cpp", ".cc"), "cuda": (".cu", ".cpp", ".cc")}
HEADER_EXTS = (".h", ".hpp", ".cuh")
MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 2 * 1024 * 1024
MAX_KERNEL_FILES = 32
# skills/infra's headers (krl_abi.h, krl_math.h): built with every workspace, never taken from one
FIXED_HEADERS = {p.name for p in (Path(__file__).resolve().parents[1] / "skills" / "infra").glob("*.h")}


class WorkspaceError(KernelRLError):
    """The request's files do not form a valid workspace; the message says which file and why."""


def _norm(path: str) -> str:
    p = posixpath.normpath(path.replace("\\", "/"))
    if p.startswith("/") or p == ".." or p.startswith("../") or "\x00" in p:
        raise WorkspaceError(f"file {path!r}: paths must be relative to the workspace and stay inside it")
    return p.removeprefix("./")


def validate(files: dict[str, str], backend: str) -> dict[str, str]:
    """Keep model_new.py and kernels/* sources; reject bad paths and oversize files."""
    if backend not in SOURCE_EXTS:
        raise WorkspaceError(f"backend {backend!r} is not one of {sorted(SOURCE_EXTS)}")
    out: dict[str, str] = {}
    total = 0
    for raw, text in files.items():
        path = _norm(raw)
        if not isinstance(text, str):
            raise WorkspaceError(f"file {path}: content must be text")
        size = len(text.encode())
        if size > MAX_FILE_BYTES:
            raise WorkspaceError(f"file {path}: {size} bytes exceeds the {MAX_FILE_BYTES}-byte limit")
        total += size
        if path == MODEL_NEW:
            out[path] = text
        elif path.startswith(KERNEL_DIR + "/") and path.endswith(SOURCE_EXTS[backend] + HEADER_EXTS):
            if path.count("/") != 1:
                raise WorkspaceError(f"file {path}: kernel sources live directly in kernels/ (no subfolders)")
            if posixpath.basename(path) in FIXED_HEADERS:
                raise WorkspaceError(f"file {path}: {posixpath.basename(path)} is fixed infrastructure; "
                                     "do not shadow it")
            out[path] = text
    if total > MAX_TOTAL_BYTES:
        raise WorkspaceError(f"workspace: {total} bytes exceeds the {MAX_TOTAL_BYTES}-byte limit")
    if MODEL_NEW not in out:
        raise WorkspaceError(f"workspace: {MODEL_NEW} is missing")
    if len(kernel_sources(out, backend)) > MAX_KERNEL_FILES:
        raise WorkspaceError(f"workspace: more than {MAX_KERNEL_FILES} kernel sources")
    return out


def kernel_sources(files: dict[str, str], backend: str) -> list[str]:
    """Paths of the translation units to compile (sorted)."""
    return sorted(p for p in files if p.startswith(KERNEL_DIR + "/") and p.endswith(SOURCE_EXTS[backend]))


def build_inputs(files: dict[str, str]) -> dict[str, str]:
    """The files that affect the build (model_new.py does not)."""
    return {p: t for p, t in files.items() if p.startswith(KERNEL_DIR + "/")}


def write(files: dict[str, str], root: Path) -> None:
    for rel, text in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)


def read_dir(root: str | Path) -> dict[str, str]:
    """Load a solution folder (model_new.py + kernels/) into a files dict."""
    root = Path(root)
    if not root.is_dir():
        raise WorkspaceError(f"solution folder {str(root)!r} does not exist")
    files = {}
    if (root / MODEL_NEW).is_file():
        files[MODEL_NEW] = (root / MODEL_NEW).read_text()
    kdir = root / KERNEL_DIR
    if kdir.is_dir():
        for p in sorted(kdir.iterdir()):
            if p.is_file() and p.suffix in (".cpp", ".cc", ".cu") + HEADER_EXTS:
                files[f"{KERNEL_DIR}/{p.name}"] = p.read_text()
    return files
