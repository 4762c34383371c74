"""Process helpers shared by the broker launcher and the role supervisor."""
from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the process that started it dies, even by
    SIGKILL (Linux prctl), so a killed `kernelrl up` or test session leaves no orphans."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux prctl): what a dead role leaves
    behind, even after setsid() (a vLLM engine, a compile job), is re-parented here instead of to init,
    so `orphans()` finds it. False where the kernel refuses."""
    return ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def children(pid: int | None = None) -> dict[int, str]:
    """The live (non-zombie) direct children of ``pid`` (default: this process) and their command lines."""
    import os
    from pathlib import Path

    parent = os.getpid() if pid is None else pid
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) != parent or fields[0] == "Z":
                continue
            out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
        except (OSError, ValueError, IndexError):
            continue
    return out
