"""A pre-imported, never-trusting parent for evaluation children (a fork server).

Importing torch costs 2-5 s; paying it per candidate dominated evaluation. The
zygote is a fresh sandboxed process (no network, minimal env) that imports
torch and the runner, then only forks: each job is a new child of the clean
zygote (new session, its own rlimits, stdout/stderr to files), runs one spec
and exits. Candidate code never runs in the zygote or the worker, and CUDA is
never initialised before the fork. Protocol on the zygote's stdin/stdout: one
JSON line per job in; {"pid"} then {"pid", "status"} lines out.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys


def _child(job: dict) -> None:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    lim = job.get("limits", {})
    if lim.get("memory_mb"):
        n = int(lim["memory_mb"]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (n, n))
    if lim.get("cpu_s"):
        n = int(lim["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (n, n + 5))
    if lim.get("file_size_mb"):
        n = int(lim["file_size_mb"]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    os.chdir(job["cwd"])
    for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    from sandbox_workers.runner import run_spec

    code = 1
    try:
        code = run_spec(job["spec"])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    import torch  # noqa: F401 - the point of the zygote: pay this once

    import torch._dynamo  # noqa: F401 - a dispatch mode's first use imports it (4 s)

    import sandbox_workers.runner_candidate  # noqa: F401
    import sandbox_workers.runner_reference  # noqa: F401
    from sandbox_workers import runtime_guards as rg
    from sandbox_workers.backends import cpu  # noqa: F401

    with rg.ComputeGuard(rg.Recorder()):  # warm the dispatch-mode path (lazy imports), no threads started
        torch.empty(1)

    out = sys.stdout
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _child(job)
            finally:
                os._exit(70)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"pid": pid, "status": status}) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()


# ---------------------------------------------------------------------------- worker side
class ZygoteClient:
    """The worker's handle on its zygote: start it lazily, run jobs with a deadline, restart it if it dies."""

    def __init__(self, env: dict, cwd: str, start_timeout_s: float = 180.0):
        self.env, self.cwd, self.start_timeout_s = env, cwd, start_timeout_s
        self.proc = None
        self._buf = b""
        self.network_isolated = False
        self.starts = 0

    def _start(self) -> None:
        import subprocess

        from sandbox_workers.isolation import network_isolation_prefix

        net = network_isolation_prefix()
        self.network_isolated = bool(net)
        self._err = open(os.path.join(self.cwd, "zygote.log"), "ab")
        self.proc = subprocess.Popen([*net, sys.executable, "-m", "sandbox_workers.zygote"], cwd=self.cwd,
                                     env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     start_new_session=True)
        self._buf = b""
        self.starts += 1
        msg = self._readline(self.start_timeout_s)
        if not msg or not msg.get("ready"):
            self.close()
            raise RuntimeError(f"evaluation zygote did not start (see {self.cwd}/zygote.log)")

    def _readline(self, timeout: float) -> dict | None:
        import select
        import time

        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def run(self, spec: dict, cwd: str, limits, max_output_chars: int = 0):
        """Fork one child for `spec`; returns an isolation.RunOutcome."""
        import time

        from sandbox_workers import isolation

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        out_p, err_p = os.path.join(cwd, "..", "child.out"), os.path.join(cwd, "..", "child.err")
        job = {"spec": spec, "cwd": cwd, "stdout": out_p, "stderr": err_p,
               "limits": {"memory_mb": limits.memory_mb, "cpu_s": limits.cpu_s, "file_size_mb": limits.file_size_mb}}
        t0 = time.monotonic()
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.close()
            return isolation.RunOutcome(125, "", "evaluation zygote died", 0.0)
        started = self._readline(60.0)
        if not started:
            self.close()
            return isolation.RunOutcome(125, "", "evaluation zygote did not fork", time.monotonic() - t0)
        pid = started["pid"]
        isolation.register_pgid(pid)
        timed_out = False
        try:
            done = self._readline(limits.wall_s)
            if done is None:
                timed_out = True
                isolation.kill_pgid(pid)
                done = self._readline(30.0)
        finally:
            isolation.kill_pgid(pid)  # grandchildren, if any
            isolation.unregister_pgid(pid)
        if done is None:
            self.close()
            return isolation.RunOutcome(125, "", "evaluation zygote stopped answering", time.monotonic() - t0,
                                        timed_out, self.network_isolated)
        st = done["status"]
        rc = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -os.WTERMSIG(st)
        sig = signal.Signals(os.WTERMSIG(st)).name if os.WIFSIGNALED(st) else ""
        return isolation.RunOutcome(rc, isolation.read_capped_path(out_p, max_output_chars),
                                    isolation.read_capped_path(err_p, max_output_chars), time.monotonic() - t0,
                                    timed_out, self.network_isolated, sig)

    def close(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            self.proc = None
            self._err.close()
