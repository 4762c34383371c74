"""One judged run: start the trusted judge and the remote model in two sandboxes, joined by pipes.

The worker (this process) never runs task or candidate code. It makes a job folder (on
/dev/shm when it can: the arena holding weights, inputs and outputs is memory, not disk),
starts the judge (task code, trusted) and the remote (candidate code in the strictest
profile, or the task's Model for the baselines) each in its own OS sandbox, gives each one
end of two pipes, waits for the judge's result under a deadline, and kills both whatever
happened. Neither sandbox sees the other's folder, the baseline cache or the repository's
other files.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from cluster.config import PROJECT_ROOT
from sandbox_workers import cpuset, device_gate, isolation
from sandbox_workers.isolation import Limits

log = logging.getLogger(__name__)
# CPU: glibc's malloc keeps what the model frees (outputs up to 32 MiB come from the heap, which is never trimmed).
# By default a freed output of a few MiB raises the mmap threshold to its size and the trim threshold to twice
# that, so a batched trial's outputs (b x 16 MiB) are returned to the kernel at the end of a trial and page-fault
# again in the next one (4096 minor faults, +4-5 ms per 16 MiB): timed calls that fault at random made the
# baselines noisy, and a noisy cached baseline is timed again on every evaluation. The same for the judge, whose
# copy of the outputs ends the round trip it measures. Fair to every variant: each remote gets the same setting.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
INFRA = PROJECT_ROOT / "skills" / "infra"


@dataclass
class SessionResult:
    judge: dict | None  # the judge's result, None when it produced none
    remote_rc: int | None = None
    remote_signal: str = ""
    remote_log: str = ""
    judge_log: str = ""
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)
    gate: list[dict] = field(default_factory=list)  # the judge's holds of the device gate (device_gate.py)
    profile: dict | None = None  # the candidate's CPU time in the judge's run round trips (cpu_profile.foreign_time)
    profile_error: str = ""  # why there is none where one was asked for (the evaluator fails closed on it)


def _job_root() -> str | None:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


class Session:
    """Paths inside the sandboxes are fixed (/job/...); with isolation "none" they are the host's."""

    def __init__(self, cfg, backend: str, role: str, inductor_cache: Path | None = None, profile: bool = False):
        self.cfg, self.sb, self.backend, self.role = cfg, cfg.sandbox, backend, role
        self.inductor_cache = inductor_cache
        self.profile = profile  # sample the remote's CPU time (cpu_profile.py); read only for the candidate
        self.sampler = None
        self.profile_error = ""
        self.isolated = getattr(self.sb, "isolation", "none") != "none"
        self.procs: list[subprocess.Popen] = []  # [remote, judge] once started
        self.gate: device_gate.DeviceGate | None = None  # set by the evaluator before start(): the device's gate
        self._logs: list = []
        self.dir = Path(tempfile.mkdtemp(prefix="krl-job-", dir=_job_root()))
        self.sid = self.dir.name
        for sub in ("judge", "remote"):
            (self.dir / sub).mkdir()
        self.arena = self.dir / "arena"
        self.arena.write_bytes(b"\0" * (1 << 20))
        if self.isolated:
            from sandbox_workers import ossandbox

            for p in (self.dir, self.dir / "judge", self.dir / "remote"):
                ossandbox.prepare_dir(str(p))
            ossandbox.prepare_dir(str(self.arena))

    def path(self, host: Path, inside: str) -> str:
        return inside if self.isolated else str(host)

    def add_library(self, lib: Path) -> str:
        dst = self.dir / "remote" / "libkrl_ops.so"
        shutil.copyfile(lib, dst)
        os.chmod(dst, 0o555)
        return self.path(dst, "/job/remote/libkrl_ops.so")

    def infra(self) -> str:
        return self.path(INFRA, "/krl/infra")

    # ------------------------------------------------------------------ processes
    def start(self) -> "Session":
        """Spawn both processes now (they import torch, then wait: the judge for its spec, the remote for
        the judge). A pre-started session hides that start-up behind the previous evaluation."""
        j_r, r_w = os.pipe()  # remote -> judge
        r_r, j_w = os.pipe()  # judge -> remote
        # CUDA: the device arena's descriptor goes judge -> remote over this (before the remote's seccomp)
        socks = socket.socketpair() if self.backend == "cuda" and self.sb.cuda_device_arena else None
        s_j, s_r = (socks[0].fileno(), socks[1].fileno()) if socks else (-1, -1)
        # the device gate: judge -> worker requests, worker -> judge grants; the judge's ends only, never the remote's
        gate_fds = (*os.pipe(), *os.pipe()) if self.gate is not None else ()
        self._logs = [open(self.dir / "remote.log", "w+b"), open(self.dir / "judge.log", "w+b")]  # noqa: SIM115 - the children write them until close()
        spawning = self.gate.spawning(self.sid) if self.gate is not None else _no_gate()
        try:
            with spawning as add:  # never while another session is timed; frozen with the rest from here on
                self.procs.append(self._spawn_remote(r_r, r_w, self._logs[0], s_r))
                add(self.procs[-1].pid)
                self._start_profile(self.procs[-1].pid)
                self.procs.append(self._spawn_judge(j_r, j_w, self._logs[1], s_j, gate_fds[2:0:-1]))
                add(self.procs[-1].pid, judge=True)
            if gate_fds:
                self.gate.serve(self.sid, gate_fds[0], gate_fds[3])
                gate_fds = (gate_fds[1], gate_fds[2])  # the worker's copies of the judge's ends
        finally:
            for fd in (j_r, r_w, r_r, j_w, *gate_fds):
                os.close(fd)
            for sk in socks or ():
                sk.close()
        return self

    def alive(self) -> bool:
        return len(self.procs) == 2 and all(p.poll() is None for p in self.procs)

    def run(self, spec: dict, wall_s: float) -> SessionResult:
        if not self.procs:
            self.start()
        remote, judge = self.procs
        spec = dict(spec, result_path=self.path(self.dir / "judge" / "result.json", "/job/judge/result.json"))
        timed_out, prof = False, None
        t_end = time.monotonic() + wall_s
        data: bytes | None = json.dumps(spec).encode()
        try:
            while True:
                try:
                    judge.communicate(data, timeout=max(0.1, t_end + self._gate_credit() - time.monotonic()))
                    break
                except subprocess.TimeoutExpired:
                    data = None
                    if time.monotonic() >= t_end + self._gate_credit():  # waiting for the gate or frozen: not counted
                        timed_out = True
                        break
                except BrokenPipeError:
                    log.warning("the judge exited before reading its spec")
                    break
            if self.sampler is not None:  # while the remote still lives: the last snapshot of its mappings
                prof, self.sampler = self.sampler.stop(), None
            try:
                remote.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        finally:
            self.kill()
        res = SessionResult(judge=_read_json(self.dir / "judge" / "result.json"), timed_out=timed_out)
        if self.profile and self.role == "candidate":
            res.profile, res.profile_error = self._foreign_time(prof, res.judge)
        res.remote_rc = remote.returncode
        res.remote_signal = signal_name(remote.returncode)
        limit = self.sb.max_output_chars
        res.remote_log = isolation.read_capped_path(str(self.dir / "remote.log"), limit)
        res.judge_log = isolation.read_capped_path(str(self.dir / "judge.log"), limit)
        if self.gate is not None:
            res.gate = self.gate.pop_log(self.sid)
        return res

    def _start_profile(self, pid: int) -> None:
        if not self.profile:
            return
        from sandbox_workers import cpu_profile

        try:
            self.sampler = cpu_profile.Sampler(pid, marker=b"sandbox_workers.candidate.serve",
                                               collect=self.role == "candidate").start()
        except cpu_profile.ProfileUnavailable as exc:
            self.profile_error = f"the CPU profile could not attach: {exc}"

    def _foreign_time(self, prof, judge: dict | None) -> tuple[dict | None, str]:
        from sandbox_workers import cpu_profile

        if prof is None:
            return None, self.profile_error or "the CPU profile was not started"
        if not prof.pid or not prof.maps:
            why = f": {prof.error}" if prof.error else ""
            return None, f"the CPU profile never attached to the model's process{why}"
        if not prof.samples:  # its start-up alone (importing torch) is seconds of CPU: the events never reached it
            return None, cpu_profile.NO_SAMPLES
        windows = [w for v in ((judge or {}).get("variants") or {}).values() if isinstance(v, dict)
                   for w in v.get("run_windows") or []]
        return cpu_profile.foreign_time(prof, windows, str(self.dir / "remote" / "libkrl_ops.so")), ""

    def _gate_credit(self) -> float:
        return self.gate.credit_total(self.sid) if self.gate is not None else 0.0

    def kill(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        for p in self.procs:
            kill_tree(p)
        if self.gate is not None and self.procs:
            self.gate.unregister(self.sid)
        for f in self._logs:
            f.close()
        self._logs = []

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _env(self, extra: dict) -> dict:
        env = isolation.sandbox_env(dict(extra, KRL_IN_SANDBOX="1", PYTORCH_NVML_BASED_CUDA_CHECK="1",
                                         PYTHONUNBUFFERED="1"), home="/tmp" if self.isolated else str(self.dir))
        if self.backend == "cpu":
            env["OMP_NUM_THREADS"] = str(cpuset.threads(self.sb.cpu_threads))
            env.update(MALLOC_ENV)
        env.pop("TORCH_COMPILE_DISABLE", None)
        env.pop("TORCHDYNAMO_DISABLE", None)
        return env

    def _spawn_remote(self, rfd: int, wfd: int, log_file, sock: int = -1) -> subprocess.Popen:
        arena = self.path(self.arena, "/job/arena")
        argv = [sys.executable, "-m", "sandbox_workers.candidate.serve", "--role", self.role, "--rfd", str(rfd),
                "--wfd", str(wfd), "--arena", arena, "--device", "cuda" if self.backend == "cuda" else "cpu",
                "--sock", str(sock)]
        if not self.isolated:
            argv.append("--no-seccomp")
        # OpenMP pools spin ~10x longer than libgomp's default before they sleep, across the judge's flush
        # (else every timed call pays their wake-up); the same for the candidate's kernels and torch's own
        extra = {"PYTHONPATH": "/krl" if self.isolated else str(PROJECT_ROOT), "GOMP_SPINCOUNT": "3000000",
                 "PYTHONWARNINGS": "ignore:Failed to initialize NumPy"}  # numpy is absent on purpose
        if self.role == "baseline" and self.inductor_cache is not None:
            self.inductor_cache.mkdir(parents=True, exist_ok=True)
            extra["TORCHINDUCTOR_CACHE_DIR"] = self.path(self.inductor_cache, "/cache/inductor")
        limits = Limits(wall_s=0, cpu_s=self.sb.cpu_time_limit_s, file_size_mb=self.sb.file_size_limit_mb,
                        memory_mb=self.sb.eval_memory_limit_mb if self.backend == "cpu" and not self.isolated else 0)
        if self.isolated:
            limits.data_mb = self.sb.eval_memory_limit_mb
        return self._spawn(argv, self._remote_profile(), limits, self._env(extra), _fds(rfd, wfd, sock), log_file)

    def _spawn_judge(self, rfd: int, wfd: int, log_file, sock: int = -1, gate: tuple = ()) -> subprocess.Popen:
        argv = [sys.executable, "-m", "sandbox_workers.judge", "--rfd", str(rfd), "--wfd", str(wfd),
                "--arena", self.path(self.arena, "/job/arena"), "--sock", str(sock)]
        # the judge's OpenMP threads must sleep, not spin, while the remote is being timed on the same cores
        extra = {"PYTHONPATH": "/krl" if self.isolated else str(PROJECT_ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
        if gate:  # (grants read end, requests write end): the judge's side of the device gate
            extra[device_gate.ENV] = f"{gate[0]},{gate[1]}"
        limits = Limits(wall_s=0, cpu_s=0, file_size_mb=0)
        return self._spawn(argv, self._judge_profile(), limits, self._env(extra), _fds(rfd, wfd, sock, *gate),
                           log_file, stdin=subprocess.PIPE)

    def _spawn(self, argv, profile, limits, env, fds, log_file, stdin=subprocess.DEVNULL) -> subprocess.Popen:
        if self.isolated:
            from sandbox_workers import ossandbox

            return ossandbox.spawn(argv, profile, limits, env, pass_fds=fds, stdin=stdin, stdout=log_file,
                                   stderr=subprocess.STDOUT)
        return spawn_plain(argv, limits, env, pass_fds=fds, stdin=stdin, stdout=log_file,
                                     stderr=subprocess.STDOUT, cwd=str(self.dir / "remote"))

    # ------------------------------------------------------------------ sandbox profiles
    def _remote_profile(self):
        if not self.isolated:
            return None
        from sandbox_workers import ossandbox

        ro = [(str(PROJECT_ROOT / "sandbox_workers" / "__init__.py"), "/krl/sandbox_workers/__init__.py"),
              (str(PROJECT_ROOT / "sandbox_workers" / "candidate"), "/krl/sandbox_workers/candidate"),
              (str(INFRA), "/krl/infra"), (str(self.dir / "remote"), "/job/remote")]
        rw = [(str(self.arena), "/job/arena")]
        trusted = self.role == "baseline"
        if trusted and self.inductor_cache is not None:
            rw.append((str(self.inductor_cache), "/cache/inductor"))
        return ossandbox.Profile(name="baseline" if trusted else "candidate", ro_binds=ro, rw_binds=rw,
                                 chdir="/job/remote", tmp_mb=self.sb.sandbox_tmp_mb, gpu=self.backend == "cuda",
                                 toolchain=trusted)

    def _judge_profile(self):
        if not self.isolated:
            return None
        from sandbox_workers import ossandbox

        ro = [(str(PROJECT_ROOT / d), f"/krl/{d}") for d in ("sandbox_workers", "cluster", "schemas", "skills")]
        rw = [(str(self.dir / "judge"), "/job/judge"), (str(self.arena), "/job/arena")]
        return ossandbox.Profile(name="judge", ro_binds=ro, rw_binds=rw, chdir="/job/judge",
                                 tmp_mb=self.sb.sandbox_tmp_mb, gpu=self.backend == "cuda", toolchain=False)


def _read_json(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def spawn_plain(argv, limits: Limits, env, *, pass_fds, stdin, stdout, stderr, cwd) -> subprocess.Popen:
    """isolation = "none": the same process tree without a sandbox (trusted code only)."""
    cmd = [*isolation.limits_prefix(limits), *argv] if (limits.cpu_s or limits.memory_mb or limits.file_size_mb) \
        else list(argv)
    return subprocess.Popen(cmd, env=env, pass_fds=pass_fds, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd,
                            start_new_session=True)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (a sandbox's outer bwrap takes its PID namespace with it), then reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        log.warning("process %d did not die after SIGKILL", proc.pid)


def signal_name(rc: int | None) -> str:
    """The signal that ended a process: a negative return code, or bwrap's 128+N for its child."""
    if rc is not None and 128 < rc < 128 + 65:
        rc = -(rc - 128)
    if rc is None or rc >= 0:
        return ""
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


@contextlib.contextmanager
def _no_gate():
    yield lambda pid, judge=False: None


def _fds(*fds: int) -> tuple[int, ...]:
    return tuple(fd for fd in fds if fd >= 0)
