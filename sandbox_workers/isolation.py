"""Run an untrusted command: fresh process group, rlimits, wall-clock deadline, no network.

With a ``profile`` (and ``isolation="bwrap"``, the default) the command runs in the
OS sandbox of ossandbox.py (bubblewrap: own user, mounts, PIDs, network; fails
closed when unavailable). Without one (or with ``isolation="none"``, trusted code):
network isolation uses a new network namespace (``unshare -n`` as root,
``unshare -rn`` as a normal user); resource limits use ``prlimit`` (util-linux),
so nothing runs in the worker's own process between fork and exec. When no
namespace can be made the run still happens and ``network_isolated`` says so.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field

from sandbox_workers.jobs import (ABORTED, Abandoned, Limits, _kill_group, abort_all,  # noqa: F401 (re-exported)
                                  kill_pgid, register_pgid, track, unregister_pgid, untrack)

log = logging.getLogger(__name__)

def read_capped_path(path: str, limit: int) -> str:
    try:
        with open(path, "rb") as f:
            return _read_capped(f, limit)
    except OSError:
        return ""

# Environment variables passed through to sandboxed children (everything else is dropped).
_PASS_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES",
             "CUDA_DEVICE_ORDER", "LD_LIBRARY_PATH", "TMPDIR")


@dataclass
class RunOutcome:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    timed_out: bool = False
    network_isolated: bool = False
    signal: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@functools.lru_cache(maxsize=1)
def network_isolation_prefix() -> tuple[str, ...]:
    """The command prefix that puts a child in a fresh network namespace, or () if none works."""
    if os.environ.get("KRL_SANDBOX_NO_UNSHARE") == "1" or not shutil.which("unshare"):
        log.warning("sandbox: no network isolation (unshare unavailable or disabled)")
        return ()
    candidates = (("unshare", "-n", "--"), ("unshare", "-rn", "--")) if os.geteuid() == 0 else \
        (("unshare", "-rn", "--"), ("unshare", "-n", "--"))
    for prefix in candidates:
        try:
            r = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return prefix
    log.warning("sandbox: cannot create a network namespace here; children keep the host network")
    return ()


def limits_prefix(limits: Limits) -> tuple[str, ...]:
    if not shutil.which("prlimit"):
        log.warning("sandbox: prlimit not found; running without resource limits")
        return ()
    args = ["prlimit", "--core=0"]
    if limits.cpu_s:
        args.append(f"--cpu={int(limits.cpu_s)}")
    if limits.memory_mb:
        args.append(f"--as={int(limits.memory_mb) * 1024 * 1024}")
    if limits.data_mb:
        args.append(f"--data={int(limits.data_mb) * 1024 * 1024}")
    if limits.file_size_mb:
        args.append(f"--fsize={int(limits.file_size_mb) * 1024 * 1024}")
    if limits.max_procs and os.geteuid() != 0:
        args.append(f"--nproc={int(limits.max_procs)}")
    return (*args, "--")


def sandbox_env(extra: dict[str, str] | None = None, home: str | None = None) -> dict[str, str]:
    """A minimal environment: no credentials, no proxies, no kernelrl config overrides."""
    env = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    if home:
        env["HOME"] = home
    env.update(extra or {})
    return env


def run_sandboxed(argv: list[str], *, cwd: str, limits: Limits, env: dict[str, str],
                  stdin: bytes = b"", network: bool = False, max_output_chars: int = 0,
                  profile=None, pass_fds=(), isolation: str = "bwrap") -> RunOutcome:
    """Run argv isolated; on deadline kill its whole process group. Never raises for the child's failures.

    With a profile (ossandbox.Profile) and isolation "bwrap", argv runs in the OS sandbox (chdir defaults to
    cwd; raises ossandbox.IsolationUnavailable when bwrap cannot run: fail closed); `network` is then ignored.
    """
    boxed = False
    if profile is not None:
        from sandbox_workers import ossandbox
        boxed = ossandbox.mode(isolation) == "bwrap"
    if boxed:
        if profile.chdir == "/" and cwd:
            profile = dataclasses.replace(profile, chdir=cwd)
        net = () if profile.network else ("bwrap",)
        cmd = ossandbox.wrap(argv, profile, limits, env)
        popen_env, popen_cwd = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, "/"
    else:
        net = () if network else network_isolation_prefix()
        cmd = [*net, *limits_prefix(limits), *argv]
        popen_env, popen_cwd = env, cwd
    t0 = time.monotonic()
    timed_out = False
    with tempfile.TemporaryFile() as fout, tempfile.TemporaryFile() as ferr:
        try:
            proc = subprocess.Popen(cmd, cwd=popen_cwd, env=popen_env, stdin=subprocess.PIPE, stdout=fout,
                                    stderr=ferr, start_new_session=True, pass_fds=tuple(pass_fds))
        except OSError as exc:
            return RunOutcome(127, "", f"cannot start {argv[0]}: {exc}", 0.0, network_isolated=bool(net))
        track(proc)
        try:
            proc.communicate(stdin, timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc)  # the deadline, or leftovers (grandchildren) of a finished child
            proc.wait()
            untrack(proc)
        out, err = _read_capped(fout, max_output_chars), _read_capped(ferr, max_output_chars)
    rc = proc.returncode
    if boxed and rc > 128 and rc - 128 in (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS,
                                           signal.SIGFPE, signal.SIGILL, signal.SIGXCPU, signal.SIGXFSZ,
                                           signal.SIGSYS, signal.SIGTERM):
        rc = -(rc - 128)  # bwrap reports a child killed by signal N as exit 128 + N
    sig = signal.Signals(-rc).name if rc < 0 and -rc in signal.valid_signals() else ""
    return RunOutcome(rc, out, err, time.monotonic() - t0, timed_out, bool(net), sig)


def _read_capped(f, limit: int) -> str:
    """Head and tail of a (possibly huge) output file, never all of it in memory."""
    size = f.seek(0, os.SEEK_END)
    cap = limit if limit > 0 else 1 << 20
    if size <= cap:
        f.seek(0)
        return f.read().decode(errors="replace")
    head, tail = cap * 2 // 3, cap - cap * 2 // 3
    f.seek(0)
    a = f.read(head)
    f.seek(size - tail)
    b = f.read(tail)
    return (f"{a.decode(errors='replace')}\n... [{size - cap} bytes truncated] ...\n"
            f"{b.decode(errors='replace')}")
