"""The per-device timing gate: timed phases run alone on the device (other jobs' sandboxes frozen), the rest shared.

Several evaluation jobs may be in flight on one device (``sandbox.jobs_per_device``): one job's session start,
load and verification overlap another's timing, but nothing else runs on the device while a candidate or a
baseline is timed. The gate lives in the evaluation worker (trusted), one per device and process:

- the trusted judge of each session asks for it over a private pipe pair (``KRL_GATE_FDS`` in the judge's
  environment only: the candidate process never gets the descriptors), ``shared`` around its untimed device
  phases (reference, verification, loading, warm-up) and ``exclusive`` around its timed ones (the reference's
  time that sizes the batch, the protocol probe, every variant's timed trials, baselines included);
- exclusive waits until every shared holder has left its phase (and new shared requests wait behind a waiting
  exclusive one; exclusive requests are granted in the order they were made), then every process of every *other*
  session (candidates and baselines, the pre-started pool) is stopped with SIGSTOP, the whole process tree (a
  sandbox's inner processes run in their own session, so process groups are not enough), and continued (SIGCONT) at
  release; sessions are spawned only while no exclusive section runs;
- the other sessions' *judges* are frozen too unless ``freeze_judges`` is off (``sandbox.gate_freeze_judges``, off
  on CUDA by default): a judge is trusted code that touches the device only while it holds the gate, apart from
  making its CUDA context, so left running it does its host-only work (its start, the task's source, the reference
  model built on the CPU) while another job is timed, and then waits in its next request. On the CPU backend every
  running process takes the timed job's cores, so they stay frozen there. No judge is holding the gate while
  another is exclusive, so none is frozen in the middle of a phase;
- time a session spends waiting for the gate or frozen is credited to its judge's deadline and to the worker's
  wall limit on the session (it is nobody's fault);
- on the CUDA backend the holder may also wait (bounded: ``sandbox.gate_idle_wait_s``) until NVML reports the
  device idle before its clock starts: kernels a frozen process had already queued keep running (SIGSTOP stops
  the host threads, not the device's queue); when the device does not go idle in time the grant says so and the
  job's timing is marked noisy (a cached baseline is then measured again on its next use).

Every grant and release is logged with monotonic timestamps per session (``pop_log``): the evaluator puts them
in the result's evidence, and the tests check that timed windows never overlap another job's device phases.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from contextlib import contextmanager

log = logging.getLogger(__name__)

SHARED, EXCLUSIVE = "shared", "exclusive"
MODES = (SHARED, EXCLUSIVE)
ENV = "KRL_GATE_FDS"  # "<reply read fd>,<request write fd>" in the judge's environment

_gates: dict[str, DeviceGate] = {}
_gates_lock = threading.Lock()


def for_device(key: str, freeze: bool, idle_wait_s: float = 0.0, nvml: bool = False,
               freeze_judges: bool = True) -> DeviceGate:
    """The process's gate of device ``key`` (Evaluators of one device in one process share it)."""
    with _gates_lock:
        gate = _gates.get(key)
        if gate is None:
            gate = _gates[key] = DeviceGate(key, freeze, idle_wait_s, nvml, freeze_judges)
        else:  # the strictest settings win
            gate.freeze = gate.freeze or freeze
            gate.freeze_judges = gate.freeze_judges or freeze_judges
            gate.idle_wait_s = max(gate.idle_wait_s, idle_wait_s)
            gate.nvml = gate.nvml or nvml
        return gate


class DeviceGate:
    """A readers-writer gate (writers first) over one device, with the freezing of every other session's processes
    while a writer holds it. Holders are named by session id (or any string, e.g. a local build)."""

    def __init__(self, key: str, freeze: bool = True, idle_wait_s: float = 0.0, nvml: bool = False,
                 freeze_judges: bool = True):
        self.key, self.freeze, self.idle_wait_s, self.nvml = key, freeze, idle_wait_s, nvml
        self.freeze_judges = freeze_judges
        self._cv = threading.Condition()
        self._shared: dict[str, int] = {}
        self._excl: str | None = None
        self._excl_waiting = 0
        self._excl_queue: list[object] = []  # exclusive requests waiting, oldest first: granted in that order
        self._members: dict[str, tuple[int, ...]] = {}  # session id -> root pids of its processes
        self._judges: dict[str, tuple[int, ...]] = {}  # session id -> root pids of its trusted judge
        self._frozen: dict[str, list[int]] = {}  # session id -> pids stopped for the current exclusive holder
        self._frozen_at = 0.0
        self._credit: dict[str, float] = {}  # seconds waited or frozen, not yet reported to the session's judge
        self._credit_total: dict[str, float] = {}
        self._log: dict[str, list[dict]] = {}  # session id -> its holds, oldest first
        self._open: dict[str, list[dict]] = {}  # session id -> its holds not yet released
        self._handle = None
        self._waiting_since: dict[str, float] = {}  # session id -> when its pending request was made
        self._gone: dict[str, float] = {}  # sessions ended (-> when): a request still waiting for them is dropped

    # ------------------------------------------------------------------ holding
    def acquire(self, sid: str, mode: str, phase: str = "") -> dict:
        """Block until ``sid`` holds the gate in ``mode``; the grant's record (timestamps, what was frozen)."""
        if mode not in MODES:
            raise ValueError(f"gate mode {mode!r}")
        t_req = time.monotonic()
        with self._cv:
            self._waiting_since[sid] = t_req
            try:
                frozen = self._take(sid, mode)
            finally:
                self._waiting_since.pop(sid, None)
            t_grant = time.monotonic()
            rec = {"mode": mode, "phase": phase, "t_request": t_req, "t0": t_grant, "t1": None,
                   "waited_s": round(t_grant - t_req, 6), "frozen": frozen}
            self._log.setdefault(sid, []).append(rec)
            self._open.setdefault(sid, []).append(rec)
            credit = self._credit.pop(sid, 0.0) + (t_grant - t_req)
            self._credit_total[sid] = self._credit_total.get(sid, 0.0) + (t_grant - t_req)
        if mode == EXCLUSIVE and frozen and self.nvml:
            rec.update(self._wait_idle())  # idle_wait_s 0: one reading of the device's utilisation, for the record
            rec["t0"] = time.monotonic()  # the section's clock may start from here
        return dict(rec, credit_s=round(credit, 6))

    def _take(self, sid: str, mode: str) -> int:
        """Wait (lock held) until ``sid`` may hold the gate in ``mode`` and take it; the processes frozen."""
        if mode == EXCLUSIVE:
            # first come, first served among exclusive requests (a waiting one is never overtaken by a later one);
            # a requester that still holds the gate shared itself is not held back by the order (it could not
            # let an older request through)
            ticket = object()
            self._excl_queue.append(ticket)
            self._excl_waiting += 1
            try:
                while self._excl is not None or any(s != sid for s in self._shared) or \
                        (self._excl_queue[0] is not ticket and sid not in self._shared):
                    self._check_gone(sid)
                    self._cv.wait()
                self._check_gone(sid)
            finally:
                self._excl_waiting -= 1
                self._excl_queue.remove(ticket)
                self._cv.notify_all()  # shared requests wait behind a waiting exclusive one
            self._excl = sid
            return self._freeze_others(sid) if self.freeze else 0
        while (self._excl is not None and self._excl != sid) or self._excl_waiting:
            self._check_gone(sid)
            self._cv.wait()
        self._check_gone(sid)
        self._shared[sid] = self._shared.get(sid, 0) + 1
        return 0

    def _check_gone(self, sid: str) -> None:
        if sid in self._gone:
            raise SessionGone(sid)

    def release(self, sid: str) -> None:
        """Release ``sid``'s most recent hold (an exclusive one continues the frozen sessions)."""
        with self._cv:
            opened = self._open.get(sid) or []
            if not opened:
                return
            rec = opened.pop()
            rec["t1"] = time.monotonic()
            if rec["mode"] == EXCLUSIVE and self._excl == sid:
                self._thaw()
                self._excl = None
            elif rec["mode"] == SHARED and sid in self._shared:
                self._shared[sid] -= 1
                if self._shared[sid] <= 0:
                    del self._shared[sid]
            self._cv.notify_all()

    def release_all(self, sid: str) -> None:
        while self._open.get(sid):
            self.release(sid)

    @contextmanager
    def holding(self, sid: str, mode: str, phase: str = ""):
        self.acquire(sid, mode, phase)
        try:
            yield
        finally:
            self.release(sid)

    # ------------------------------------------------------------------ sessions
    @contextmanager
    def spawning(self, sid: str):
        """Spawn a session's processes inside this block: it waits for no exclusive section to be running and
        keeps one from starting until the processes are registered (``add(pid)``; ``add(pid, judge=True)`` for the
        trusted judge), so they are frozen with the rest."""
        roots: list[int] = []
        judges: list[int] = []

        def add(pid: int, judge: bool = False) -> None:
            (judges if judge else roots).append(pid)

        with self._cv:
            while self._excl is not None:
                self._cv.wait()
            yield add
            self._members[sid] = tuple(roots)
            self._judges[sid] = tuple(judges)

    def unregister(self, sid: str) -> None:
        """The session ended: drop its holds (a judge killed mid-phase) and its processes."""
        self.release_all(sid)
        with self._cv:
            now = time.monotonic()
            if len(self._gone) > 1000:
                self._gone = {k: t for k, t in self._gone.items() if now - t < 600}
            self._gone[sid] = now
            self._members.pop(sid, None)
            self._judges.pop(sid, None)
            self._credit.pop(sid, None)
            self._credit_total.pop(sid, None)
            self._open.pop(sid, None)
            self._cv.notify_all()

    def credit_total(self, sid: str) -> float:
        """Seconds session ``sid`` has waited for the gate or been frozen (its wall limit is extended by them)."""
        with self._cv:
            extra = self._credit_total.get(sid, 0.0)
            if sid in self._frozen:
                extra += time.monotonic() - self._frozen_at
            if sid in self._waiting_since:  # a request still waiting
                extra += time.monotonic() - self._waiting_since[sid]
            return extra

    def pop_log(self, sid: str) -> list[dict]:
        with self._cv:
            return [dict(r) for r in self._log.pop(sid, [])]

    def serve(self, sid: str, rfd: int, wfd: int) -> threading.Thread:
        """Answer the judge of session ``sid`` on its pipe pair (JSON lines), on a thread; at the pipe's end (the
        judge exited or was killed) whatever it still held is released."""
        t = threading.Thread(target=self._serve, args=(sid, rfd, wfd), name=f"gate-{sid[-8:]}", daemon=True)
        t.start()
        return t

    def _serve(self, sid: str, rfd: int, wfd: int) -> None:
        try:
            with os.fdopen(rfd, "rb") as req:
                for line in req:
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        log.warning("gate: malformed request from session %s", sid)
                        break
                    if msg.get("op") == "release":
                        self.release(sid)
                        continue
                    try:
                        rec = self.acquire(sid, msg.get("mode", ""), str(msg.get("phase", ""))[:80])
                    except SessionGone:
                        break
                    reply = {"ok": True, "credit_s": rec["credit_s"], "idle": rec.get("idle")}
                    try:
                        os.write(wfd, (json.dumps(reply) + "\n").encode())
                    except OSError:
                        break
        except Exception:  # a broken pipe or a bad mode: the session's holds are dropped below
            log.warning("gate: serving session %s failed", sid, exc_info=True)
        finally:
            self.release_all(sid)
            try:
                os.close(wfd)
            except OSError:
                pass

    # ------------------------------------------------------------------ freezing
    def _freeze_others(self, holder: str) -> int:
        """SIGSTOP every process of every other registered session (called with the lock held), its judge's only
        with ``freeze_judges``; how many."""
        self._frozen = {}
        self._frozen_at = time.monotonic()
        n = 0
        for sid, roots in self._members.items():
            if sid == holder:
                continue
            pids = stop_tree(roots + (self._judges.get(sid, ()) if self.freeze_judges else ()))
            if pids:
                self._frozen[sid] = pids
                n += len(pids)
        return n

    def _thaw(self) -> None:
        now = time.monotonic()
        for sid, pids in self._frozen.items():
            for pid in pids:
                _signal(pid, signal.SIGCONT)
            if sid in self._members:
                self._credit[sid] = self._credit.get(sid, 0.0) + now - self._frozen_at
                self._credit_total[sid] = self._credit_total.get(sid, 0.0) + now - self._frozen_at
        self._frozen = {}

    def _wait_idle(self) -> dict:
        """Poll NVML until the device reports no kernel running, at most ``idle_wait_s``."""
        t0 = time.monotonic()
        try:
            import pynvml

            if self._handle is None:
                pynvml.nvmlInit()
                self._handle = _nvml_handle(pynvml)
            while True:
                util = pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
                waited = time.monotonic() - t0
                if self.idle_wait_s <= 0:
                    return {"util_pct": util}
                if util == 0 or waited >= self.idle_wait_s:
                    return {"idle": util == 0, "idle_wait_s": round(waited, 6), "util_pct": util}
                time.sleep(0.01)
        except Exception as exc:  # noqa: BLE001 - no NVML here: nothing to wait for, and it is said so
            return {"idle": None, "idle_error": f"{type(exc).__name__}: {exc}"[:200]}


class SessionGone(Exception):
    """The session asking for the gate has ended (its processes were killed while it waited)."""


def _nvml_handle(pynvml):
    """The device this process was pinned to (CUDA_VISIBLE_DEVICES holds its UUID), else the first."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if vis.startswith("GPU-"):
        return pynvml.nvmlDeviceGetHandleByUUID(vis)
    return pynvml.nvmlDeviceGetHandleByIndex(int(vis) if vis.isdigit() else 0)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def descendants(roots) -> list[int]:
    """``roots`` and every process below them (by /proc/<pid>/task/<tid>/children), parents first."""
    out, seen, todo = [], set(), [r for r in roots if r > 0]
    while todo:
        pid = todo.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return out


def _stopped(pid: int) -> bool:
    """True when the process is stopped, or gone (a zombie or no longer there)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("T", "t", "Z", "X")


def stop_tree(roots, settle_s: float = 0.5) -> list[int]:
    """SIGSTOP the process trees under ``roots`` and wait (at most ``settle_s``) until every one is stopped; the
    tree is walked again until no new process shows up (one may have been forking when stopped)."""
    stopped: list[int] = []
    done: set[int] = set()
    deadline = time.monotonic() + settle_s
    for _ in range(20):
        new = [p for p in descendants(roots) if p not in done]
        if not new:
            break
        for pid in new:
            done.add(pid)
            if _signal(pid, signal.SIGSTOP):
                stopped.append(pid)
        while time.monotonic() < deadline and not all(_stopped(p) for p in new):
            time.sleep(0.0005)
    return stopped


# ---------------------------------------------------------------------- the judge's side
class GateClient:
    """The judge's end: ``acquire(mode)`` (switching from what it holds), ``release()``. Without descriptors (a
    judge run by hand, a worker without a gate) every call is a no-op."""

    def __init__(self, rfd: int = -1, wfd: int = -1):
        self.rfd, self.wfd = rfd, wfd
        self.mode: str | None = None
        self.credit_s = 0.0

    @property
    def active(self) -> bool:
        return self.rfd >= 0 and self.wfd >= 0

    def acquire(self, mode: str, phase: str = "", judge=None) -> dict:
        """Hold the gate in ``mode`` (a no-op when already held so). The seconds spent waiting for it or frozen
        since the last grant are added to ``judge.deadline``."""
        if not self.active or self.mode == mode:
            return {}
        self.release()
        os.write(self.wfd, (json.dumps({"op": "acquire", "mode": mode, "phase": phase}) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = os.read(self.rfd, 4096)
            if not chunk:
                raise ConnectionError("the worker's gate closed")
            buf += chunk
        reply = json.loads(buf)
        self.mode = mode
        credit = float(reply.get("credit_s") or 0.0)
        self.credit_s += credit
        if judge is not None:
            judge.deadline += credit
        return reply

    def release(self) -> None:
        if self.active and self.mode is not None:
            os.write(self.wfd, b'{"op": "release"}\n')
            self.mode = None


_client: GateClient | None = None


def client_from_env() -> GateClient:
    """The judge process's one client (the descriptors named by ``KRL_GATE_FDS``; none: a no-op client)."""
    global _client
    if _client is None:
        try:
            rfd, wfd = (int(x) for x in os.environ.get(ENV, "").split(","))
        except ValueError:
            rfd = wfd = -1
        _client = GateClient(rfd, wfd)
    return _client
