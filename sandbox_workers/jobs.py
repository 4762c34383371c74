"""The sandboxed children alive in this worker, and the limits each runs under.

A worker's SIGTERM handler abandons its job through abort_all(): every registered child's
process group is killed and ABORTED stays set, so a child started afterwards dies at once.
Split from isolation.py so that the OS sandbox (ossandbox.py), which isolation.py drives,
can register its children without importing it back.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from dataclasses import dataclass

# Children alive right now (pid -> Popen), so a worker's SIGTERM handler can abandon its job.
_LIVE: dict[int, subprocess.Popen] = {}
_LIVE_LOCK = threading.Lock()
ABORTED = threading.Event()


class Abandoned(BaseException):
    """The worker is stopping (ABORTED is set): the current request is dropped uncommitted (redelivered later)."""


_LIVE_PGIDS: set[int] = set()


def abort_all() -> int:
    """Kill every running sandboxed child (their results are discarded). Returns how many."""
    ABORTED.set()
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
        pgids = list(_LIVE_PGIDS)
    for p in procs:
        _kill_group(p)
    for g in pgids:
        kill_pgid(g)
    return len(procs) + len(pgids)


def track(proc: subprocess.Popen) -> None:
    """Register a started child so that abort_all() kills its process group."""
    with _LIVE_LOCK:
        _LIVE[proc.pid] = proc
    if ABORTED.is_set():
        _kill_group(proc)


def untrack(proc: subprocess.Popen) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(proc.pid, None)


def register_pgid(pgid: int) -> None:
    with _LIVE_LOCK:
        _LIVE_PGIDS.add(pgid)
    if ABORTED.is_set():
        kill_pgid(pgid)


def unregister_pgid(pgid: int) -> None:
    with _LIVE_LOCK:
        _LIVE_PGIDS.discard(pgid)


def kill_pgid(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Limits:
    """Resource limits of one sandboxed run (0 = unlimited)."""

    wall_s: float = 60.0
    cpu_s: int = 0
    memory_mb: int = 0  # RLIMIT_AS without the OS sandbox; RLIMIT_DATA inside it (CUDA-safe)
    file_size_mb: int = 0  # RLIMIT_FSIZE
    max_procs: int = 0  # RLIMIT_NPROC (without the OS sandbox: not set as root, it is per-user)
    data_mb: int = 0  # RLIMIT_DATA (holds for CUDA children too; inside the OS sandbox: overrides memory_mb)
    open_files: int = 0  # RLIMIT_NOFILE (OS sandbox only)
