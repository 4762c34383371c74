"""Compile a workspace into a shared library, once per content hash (the compile tool).

Cache key: sha256 over the kernel sources, the fixed infrastructure, flags,
backend, toolchain and torch versions. Artifacts live in a shared directory
(``<key[:2]>/<key>/libkrl_ops.so`` + ``meta.json``), written atomically, so a
redelivered or repeated request costs a stat() and concurrent builders of the
same key cannot corrupt each other.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_workers import binpolicy, formats, guards, workspace
from sandbox_workers.backends import get_builder
from sandbox_workers.backends.base import INFRA_DIR, LIBRARY_NAME, FlagError
from sandbox_workers.backends.torchext import TorchExtBuilder

log = logging.getLogger(__name__)


@dataclass
class CompileOutcome:
    ok: bool
    key: str = ""
    library: Path | None = None
    cached: bool = False
    log: str = ""
    error: str = ""
    violations: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    network_isolated: bool = False


@functools.lru_cache(maxsize=1)
def torch_version() -> str:
    """torch's version without importing it (the compile worker stays light)."""
    try:
        from importlib.metadata import version
        return version("torch")
    except Exception:  # noqa: BLE001 - metadata missing: fall back to a marker
        return "unknown"


@functools.lru_cache(maxsize=1)
def _infra_digest() -> str:
    h = hashlib.sha256()
    for p in sorted(INFRA_DIR.iterdir()):
        if p.suffix in (".h", ".cpp"):
            h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def artifact_root(cfg) -> Path:
    root = cfg.sandbox.artifact_cache_dir or os.path.join(cfg.broker.cache_dir, "artifacts")
    p = Path(root).expanduser()
    p.mkdir(parents=True, exist_ok=True)
    return p


def pch_root(cfg) -> Path:
    """Where the torch precompiled headers live (``sandbox.pch_cache_dir``, else ``<artifact cache>/pch``)."""
    custom = getattr(cfg.sandbox, "pch_cache_dir", "")
    p = Path(custom).expanduser() if custom else artifact_root(cfg) / "pch"
    p.mkdir(parents=True, exist_ok=True)
    return p


def cache_key(files: dict[str, str], backend: str, cfg, extra_flags: list[str] = ()) -> str:
    builder = get_builder(backend)
    flags = cfg.sandbox.cpu_flags if backend == "cpu" else cfg.sandbox.cuda_arch
    plan = formats.plan(files, backend)  # FormatError: a foreign format that cannot be read statically
    doc = {"v": 1, "backend": backend, "files": workspace.build_inputs(files), "flags": flags,
           "extra": list(extra_flags), "toolchain": builder.toolchain_id(), "torch": torch_version(),
           "infra": _infra_digest(),
           # a stored artifact passed this policy: unchecked builds (static guards off) never share its key
           "policy": binpolicy.POLICY_VERSION if cfg.sandbox.static_guards else "off"}
    if plan.fmt != formats.KRL:  # a torch extension: its generated sources, module name, flags, Python ABI
        doc.update(files=plan.sources, format=plan.fmt, module=plan.module, cflags=plan.cflags,
                   cuda_cflags=plan.cuda_cflags, toolchain=TorchExtBuilder(backend).toolchain_id())
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def artifact_dir(cfg, key: str) -> Path:
    return artifact_root(cfg) / key[:2] / key


def lookup(cfg, key: str) -> Path | None:
    lib = artifact_dir(cfg, key) / LIBRARY_NAME
    return lib if lib.is_file() else None


def store(cfg, key: str, library_bytes: bytes, meta: dict) -> Path:
    """Atomically place an artifact under its key (first writer wins)."""
    dest = artifact_dir(cfg, key)
    if (dest / LIBRARY_NAME).is_file():
        return dest / LIBRARY_NAME
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=dest.parent))
    (tmp / LIBRARY_NAME).write_bytes(library_bytes)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    try:
        os.rename(tmp, dest)
    except OSError:  # another worker stored it first
        shutil.rmtree(tmp, ignore_errors=True)
    return dest / LIBRARY_NAME


def compile_workspace(files: dict[str, str], backend: str, cfg, extra_flags: list[str] = ()) -> CompileOutcome:
    """Validate, guard, build (or hit the cache). Never raises for the agent's mistakes."""
    t0 = time.monotonic()
    try:
        files = workspace.validate(files, backend)
    except workspace.WorkspaceError as exc:
        return CompileOutcome(False, error=str(exc), duration_s=time.monotonic() - t0)
    try:
        plan = formats.plan(files, backend)
    except workspace.WorkspaceError as exc:
        return CompileOutcome(False, error=str(exc), duration_s=time.monotonic() - t0)
    found = formats.check_cpp(files, backend)
    if found:
        detail = "\n".join(f"{v.name}: {v.detail}" for v in found)
        return CompileOutcome(False, error="forbidden code in kernel sources", log=detail,
                              violations=sorted({v.name for v in found}), duration_s=time.monotonic() - t0)
    sources = workspace.kernel_sources(files, backend) if plan.fmt == formats.KRL else sorted(plan.sources)
    if not sources:
        return CompileOutcome(False, error=f"no kernel sources in kernels/ (expected {workspace.SOURCE_EXTS[backend]})",
                              duration_s=time.monotonic() - t0)
    try:
        key = cache_key(files, backend, cfg, extra_flags)
    except FlagError as exc:
        return CompileOutcome(False, error=str(exc), duration_s=time.monotonic() - t0)
    hit = lookup(cfg, key)
    if hit is not None:
        meta = _read_meta(hit.parent)
        return CompileOutcome(True, key, hit, True, meta.get("log", ""), duration_s=time.monotonic() - t0)
    with tempfile.TemporaryDirectory(prefix="krl-build-") as tmp:
        try:
            out = get_builder(backend).build(files, sources, Path(tmp), cfg, extra_flags) if plan.fmt == formats.KRL \
                else TorchExtBuilder(backend).build(plan, Path(tmp), cfg, pch_root(cfg))
        except (FlagError, FileNotFoundError) as exc:
            return CompileOutcome(False, key, error=str(exc), duration_s=time.monotonic() - t0)
        if not out.ok:
            return CompileOutcome(False, key, log=out.log, error=out.error, duration_s=time.monotonic() - t0,
                                  network_isolated=out.network_isolated)
        builder = get_builder(backend)
        libs = [f[2:] for f in [*extra_flags, *builder.auto_libs(files)] if f.startswith("-l")]
        # the wall: what the built binary calls, runs at load time, keeps and executes (binpolicy.py)
        found = (builder.inspect(out.library, libs) if plan.fmt == formats.KRL else
                 binpolicy.inspect_library(out.library, backend, libs, module=plan.module)) \
            if cfg.sandbox.static_guards else []
        if found:
            detail = "\n".join(f"{v.name}: {v.detail}" for v in found)
            log.info("built library rejected (%s): %s", backend, "; ".join(v.detail for v in found[:3]))
            return CompileOutcome(False, key, log=(out.log + "\n" + detail).strip(),
                                  error=f"the built library breaks the kernel rules: {found[0].detail}"
                                        + (f" (and {len(found) - 1} more, see the log)" if len(found) > 1 else ""),
                                  violations=guards.names(found), duration_s=time.monotonic() - t0,
                                  network_isolated=out.network_isolated)
        lib = store(cfg, key, out.library.read_bytes(),
                    {"log": out.log, "backend": backend, "build_s": out.duration_s, "created": time.time(),
                     "format": plan.fmt, "module": plan.module})
    return CompileOutcome(True, key, lib, False, out.log, duration_s=time.monotonic() - t0,
                          network_isolated=out.network_isolated)


def _read_meta(d: Path) -> dict:
    try:
        return json.loads((d / "meta.json").read_text())
    except (OSError, ValueError):
        return {}
