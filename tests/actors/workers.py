"""Starting real compile / evaluation workers (CPU backend) as subprocesses for actor tests."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.conftest import KERNELRL, cfg_env


def start_worker(spawn, cfg, kind: str, log_dir: Path, name: str = ""):
    args = {"compile": ["compile-worker", "--group", f"{cfg.bus.topic_prefix}compile"],
            "eval": ["eval-worker", "--device", "cpu", "--group", f"{cfg.bus.topic_prefix}eval"]}[kind]
    log = open(log_dir / f"{name or kind}.log", "wb")  # noqa: SIM115 - the child process writes it
    return spawn(KERNELRL + ["-v"] + args, env=cfg_env(cfg), stdout=log, stderr=log)


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (the sandbox starts its children in new sessions)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, frontier = [], [pid]
    while frontier:
        kids = [c for c, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _building(pid: int) -> bool:
    try:
        return "krl-build" in os.readlink(f"/proc/{pid}/cwd") or \
            b"krl-build" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def wait_busy(proc, timeout_s: float = 90.0) -> None:
    """Wait until the worker runs a build (a child working in a krl-build-* folder)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(_building(p) for p in descendants(proc.pid)):
            return
        assert proc.poll() is None, "worker died"
        time.sleep(0.02)
    raise AssertionError("worker never started a build")


def signal_group(proc, sig=signal.SIGKILL) -> None:
    """Signal the worker and every process it started (as a machine crash or hang would)."""
    groups = {proc.pid}
    for p in descendants(proc.pid):
        try:
            groups.add(os.getpgid(p))
        except ProcessLookupError:
            pass
    for g in groups:
        try:
            os.killpg(g, sig)
        except ProcessLookupError:
            pass
