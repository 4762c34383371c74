"""Run the execution filter over many task sources in sandboxed child processes.

Each child (``python -m cluster.tasks.filter_runner --child FD``) imports torch once and
checks a batch of tasks, writing one JSON line per task to a dedicated pipe (the task's
own prints go to stdout/stderr and cannot forge a verdict). The parent enforces a
deadline per task: a task that hangs is killed with its child, recorded as a
``timeout`` rejection, and the rest of the batch continues in a fresh child. Children
run in a new session with resource limits, in a temporary directory and, where
``unshare -rn`` works, without network.
"""
from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Callable
from pathlib import Path

from cluster.tasks.filter import FilterConfig, Verdict

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]


@lru_cache(maxsize=1)
def _netns_prefix() -> tuple[str, ...]:
    """The sandbox's network-namespace prefix; `unshare -rn` when the sandbox is not installed."""
    try:
        from sandbox_workers.isolation import network_isolation_prefix
        return tuple(network_isolation_prefix())
    except ImportError:
        pass
    exe = shutil.which("unshare")
    if not exe:
        return ()
    try:
        ok = subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        log.warning("unshare -rn is not permitted here: filter children keep the network")
    return (exe, "-rn") if ok else ()


def _limits(memory_mb: int):
    def apply():
        import resource

        os.setsid()
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb > 0:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    return apply


class _Child:
    def __init__(self, cfg: FilterConfig, memory_mb: int, workdir: str):
        rfd, wfd = os.pipe()
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   TORCHINDUCTOR_COMPILE_THREADS="1")
        for key in ("TORCH_COMPILE_DISABLE", "TORCHDYNAMO_DISABLE"):  # the compile rules need a live torch.compile
            env.pop(key, None)
        cmd = [*_netns_prefix(), sys.executable, "-m", "cluster.tasks.filter_runner", "--child", str(wfd)]
        mem = memory_mb if cfg.backend == "cpu" else 0  # an address-space cap breaks the CUDA driver
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     pass_fds=(wfd,), cwd=workdir, env=env, preexec_fn=_limits(mem))
        os.close(wfd)
        self.rfd, self.buf, self.eof = rfd, b"", False
        self.proc.stdin.write((json.dumps({"config": cfg.to_dict()}) + "\n").encode())
        self.proc.stdin.flush()

    def send(self, source: str) -> None:
        self.proc.stdin.write((json.dumps({"source": source}) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, deadline: float) -> dict | None:
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.rfd], [], [], left)[0]:
                return None
            chunk = os.read(self.rfd, 1 << 16)
            if not chunk:  # the child closed its end: it exited or died
                self.eof = True
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def close(self, kill: bool = False) -> str:
        err = ""
        if kill and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
            err = (self.proc.stderr.read() or b"").decode(errors="replace")[-600:]
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
        os.close(self.rfd)
        return err


class FilterSession:
    """One sandboxed child kept across tasks (torch is imported once); replaced after a crash or a timeout.

    The eval worker keeps one per process for FilterRequests; `filter_sources` one per shard.
    """

    def __init__(self, cfg: FilterConfig, memory_mb: int = 8192, start_s: float = 60.0,
                 on_spawn: Callable[[int], None] | None = None, on_exit: Callable[[int], None] | None = None):
        self.cfg, self.memory_mb, self.start_s = cfg, memory_mb, start_s
        self._on_spawn, self._on_exit = on_spawn, on_exit  # the worker registers children for abort on SIGTERM
        self._dir = tempfile.TemporaryDirectory(prefix="krl-filter-")
        self._child: _Child | None = None

    def check(self, source: str, timeout_s: float, cfg: FilterConfig | None = None) -> Verdict:
        if cfg is not None and cfg != self.cfg:  # the config travels in the child's header
            self._close_child()
            self.cfg = cfg
        budget = timeout_s
        if self._child is None:
            self._child = _Child(self.cfg, self.memory_mb, self._dir.name)
            if self._on_spawn:
                self._on_spawn(self._child.proc.pid)  # the child leads its own session: pid = pgid
            budget += self.start_s  # the first task also pays for importing torch
        child = self._child
        child.send(source)
        reply = child.read(time.monotonic() + budget)
        if reply is not None:
            return Verdict(**reply)
        dead = child.eof or child.proc.poll() is not None
        err = self._close_child(kill=True)
        rule = "crash" if dead else "timeout"
        why = f"the child died: {err.strip()[-300:]}" if dead else f"no verdict within {budget:.0f} s"
        return Verdict(ok=False, rule=rule, reason=why, duration_s=budget)

    def _close_child(self, kill: bool = False) -> str:
        child, self._child = self._child, None
        if child is None:
            return ""
        err = child.close(kill=kill)
        if self._on_exit:
            self._on_exit(child.proc.pid)
        return err

    def close(self) -> None:
        self._close_child()
        self._dir.cleanup()


def _run_batch(sources: list[str], cfg: FilterConfig, timeout_s: float, memory_mb: int,
               start_s: float) -> list[Verdict]:
    session = FilterSession(cfg, memory_mb, start_s)
    try:
        return [session.check(src, timeout_s) for src in sources]
    finally:
        session.close()


def filter_sources(sources: list[str], cfg: FilterConfig | None = None, workers: int = 1,
                   timeout_s: float = 120.0, memory_mb: int = 8192, start_s: float = 60.0) -> list[Verdict]:
    """Verdicts for each source, in order, from `workers` parallel sandboxed children."""
    cfg = cfg or FilterConfig()
    if not sources:
        return []
    workers = max(1, min(workers, len(sources)))
    shards = [list(range(i, len(sources), workers)) for i in range(workers)]
    results: list[Verdict | None] = [None] * len(sources)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_batch, [sources[i] for i in shard], cfg, timeout_s, memory_mb, start_s)
                   for shard in shards]
        for shard, fut in zip(shards, futures):
            for i, verdict in zip(shard, fut.result()):
                results[i] = verdict
    return results  # type: ignore[return-value]


def _child_main(fd: int) -> int:
    from cluster.tasks.filter import check_task

    out = os.fdopen(fd, "w", buffering=1)
    header = json.loads(sys.stdin.readline())
    cfg = FilterConfig.from_dict(header["config"])
    for line in sys.stdin:
        if not line.strip():
            continue
        verdict = check_task(json.loads(line)["source"], cfg)
        out.write(json.dumps(verdict.to_dict()) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child_main(int(sys.argv[2])))
    sys.exit("usage: python -m cluster.tasks.filter_runner --child FD (started by filter_sources)")
