"""Runs roles as supervised subprocesses: per-role logs, metrics ports, restarts, clean stop.

Used by `kernelrl up` and `kernelrl chaos`. A role that exits on its own is
restarted (with backoff) unless the supervisor is stopping; stop() sends SIGTERM
to every role, waits, and SIGKILLs what is left, so no child outlives it. With
``subreaper`` the supervisor also adopts what a dead role left behind (a vLLM
engine, even one in its own session) and kills it before the role restarts.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from cluster.metrics import url_host
from cluster.broker.embedded import free_port
from cluster.launch.procs import become_subreaper, children, die_with_parent

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RoleSpec:
    name: str  # unique, e.g. "actor-0"
    argv: list[str]  # arguments after `kernelrl`
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    restart: bool = True
    # "main" roles end the run when they exit 0 (the learner after --max-steps).
    main: bool = False
    grace_s: float = 20.0  # SIGTERM -> SIGKILL delay at stop (the learner finishes its step first)
    # stopped, and waited for, before the other roles: the actors, so that the workers they call still answer the
    # episodes they finish in their grace (stopped together, the slow episodes, those still being verified, were
    # cancelled and the quick failures kept: the last version's pass rate read low)
    stop_first: bool = False
    # arguments between the interpreter and `-m cluster.cli`: a launcher such as torchrun
    # (["-m", "torch.distributed.run", "--nproc-per-node", "2", ...]), which then runs the CLI once per rank
    launcher: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class RoleProc:
    spec: RoleSpec
    proc: subprocess.Popen | None = None
    metrics_port: int = 0
    log_path: Path | None = None
    starts: int = 0
    kills: int = 0
    exit_codes: list[int] = dataclasses.field(default_factory=list)
    next_start: float = 0.0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Supervisor:
    def __init__(self, log_dir: Path, base_argv: list[str], base_env: dict[str, str] | None = None,
                 subreaper: bool = False):
        self.log_dir = Path(log_dir)
        # adopt orphans only where asked: the flag lasts for the whole process (a test session, say)
        self.subreaper = subreaper and become_subreaper()
        self.metrics_host = "127.0.0.1"  # cluster.metrics_host: what the roles' metrics endpoints bind
        self.keep_pids = lambda: set()  # other children of this process that are not orphans (the broker)
        self.orphans_killed: list[str] = []
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.base_argv = base_argv  # e.g. [python, -m, cluster.cli, --config, X]
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.roles: dict[str, RoleProc] = {}
        self.stopping = False
        self.killed_at_stop: list[str] = []  # roles SIGKILLed because they outlived their SIGTERM grace

    def add(self, spec: RoleSpec) -> RoleProc:
        # never a port another role has: two roles given one metrics port (two probes offered the same free
        # port) left the second unable to start, restarted forever, in a learning run
        taken = {r.metrics_port for r in self.roles.values()}
        rp = RoleProc(spec=spec, metrics_port=free_port("127.0.0.1", taken), log_path=self.log_dir / f"{spec.name}.log")
        self.roles[spec.name] = rp
        self._start(rp)
        return rp

    def _start(self, rp: RoleProc) -> None:
        env = {**self.base_env, **rp.spec.env, "KERNELRL_METRICS_PORT": str(rp.metrics_port),
               "KERNELRL_ROLE_NAME": rp.spec.name, "PYTHONUNBUFFERED": "1"}
        logf = open(rp.log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        logf.write(f"\n=== start {rp.starts + 1} at {time.strftime('%H:%M:%S')}: {rp.spec.launcher + rp.spec.argv}\n".encode())
        logf.flush()
        argv = self.base_argv[:1] + rp.spec.launcher + self.base_argv[1:] + rp.spec.argv
        rp.proc = subprocess.Popen(argv, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=die_with_parent)
        logf.close()
        rp.starts += 1
        log.info("started %s (pid %d)", rp.spec.name, rp.proc.pid)

    def poll(self) -> list[str]:
        """Restart roles that died; return the names of main roles that finished with 0."""
        finished = []
        now = time.time()
        for rp in self.roles.values():
            if rp.proc is None or rp.alive:
                continue
            code = rp.proc.returncode
            if rp.next_start == 0.0:
                rp.exit_codes.append(code)
                self._sweep(rp)
                if rp.spec.main and code == 0:
                    finished.append(rp.spec.name)
                    continue
                if self.stopping or not rp.spec.restart:
                    continue
                backoff = min(10.0, 0.5 * 2 ** min(rp.starts, 5))
                rp.next_start = now + backoff
                log.warning("%s exited with %s; restarting in %.1fs (log: %s)", rp.spec.name, code, backoff, rp.log_path)
            elif now >= rp.next_start and not self.stopping:
                rp.next_start = 0.0
                self._start(rp)
        return finished

    def _sweep(self, dead: RoleProc) -> None:
        """Kill what a dead role left behind: its process group, then (as subreaper) the orphans it left."""
        try:
            os.killpg(dead.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.subreaper:
            time.sleep(0.2)  # orphans of a just-dead role are re-parented to us by the kernel
            self._kill_orphans(dead.spec.name)

    def _kill_orphans(self, whose: str) -> None:
        for _ in range(5):  # an orphan's own children are re-parented to us in turn
            keep = {rp.proc.pid for rp in self.roles.values() if rp.alive} | set(self.keep_pids())
            found = {pid: cmd for pid, cmd in children().items() if pid not in keep}
            if not found:
                return
            for pid, cmd in found.items():
                log.warning("killing pid %d left behind by %s: %s", pid, whose, cmd)
                self.orphans_killed.append(f"{whose}: {cmd}")
                try:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                except (ProcessLookupError, ChildProcessError, PermissionError):
                    pass

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        rp = self.roles[name]
        if rp.alive:
            rp.kills += 1
            os.killpg(rp.proc.pid, sig)

    def scrape(self, name: str, timeout: float = 2.0) -> dict | None:
        rp = self.roles[name]
        if not rp.alive:
            return None
        try:
            url = f"http://{url_host(self.metrics_host)}:{rp.metrics_port}/metrics.json"
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM every role (``stop_first`` ones first, waited for), wait up to each role's grace (or
        ``grace_s``), SIGKILL the rest."""
        self.stopping = True
        first = [rp for rp in self.roles.values() if rp.spec.stop_first]
        for group in (first, [rp for rp in self.roles.values() if not rp.spec.stop_first]):
            self._terminate(group, grace_s)
        for rp in self.roles.values():  # sweep what a role left behind in its process group
            if rp.proc is not None:
                try:
                    os.killpg(rp.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if self.subreaper:
            self._kill_orphans("a stopped role")

    def _terminate(self, group: list[RoleProc], grace_s: float | None) -> None:
        for rp in group:
            if rp.alive:  # the role itself, not its group: it stops its own children in order
                try:
                    os.kill(rp.proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        t0 = time.time()
        for rp in group:
            if rp.proc is None:
                continue
            grace = rp.spec.grace_s if grace_s is None else grace_s
            try:
                rp.proc.wait(timeout=max(0.1, t0 + grace - time.time()))
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0fs; killing", rp.spec.name, grace)
                self.killed_at_stop.append(rp.spec.name)
                try:
                    os.killpg(rp.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rp.proc.wait()


def kernelrl_argv(config_path: str | None = None) -> list[str]:
    argv = [sys.executable, "-m", "cluster.cli", "-v"]  # roles log at INFO into their own files
    if config_path:
        argv += ["--config", config_path]
    return argv
