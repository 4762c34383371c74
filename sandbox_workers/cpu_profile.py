"""Where a sandboxed process spends its CPU time, measured from outside it: perf task-clock samples.

The trusted worker attaches software task-clock sampling events (`perf_event_open`, user-space
instruction pointers only) to every thread of the candidate's process tree, before any candidate
code is loaded, with `inherit` so the threads it creates later are followed too. Each sample is
attributed to the file mapped at its address (`/proc/PID/maps`, read repeatedly while the process
lives). Nothing here runs in, or is reported by, the sampled process: it cannot switch the events
off (they are not its own), hide a thread from them, or rename a library it maps, since files are
told apart by device and inode, never by name.

What it is for (`evaluator`): the candidate's CPU time inside the judge's run round trips that went
to code that is neither its own library nor the small runtime it may use (libc, libm, libstdc++,
OpenMP, the Python interpreter): torch's or numpy's kernels, a copied library, code in an anonymous
mapping. That time is compute the rules forbid, whatever the candidate did to the in-process guard.
"""
from __future__ import annotations

import bisect
import ctypes
import logging
import mmap
import os
import re
import struct
import sys
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_TASK_CLOCK = 1, 1
_SAMPLE_IP, _SAMPLE_TID, _SAMPLE_TIME = 1, 2, 4
_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV, _USE_CLOCKID = 1 << 1, 1 << 5, 1 << 6, 1 << 25
_FLAG_FD_CLOEXEC = 1 << 3
_IOC_SET_OUTPUT = 0x2405
_RECORD_SAMPLE, _RECORD_LOST = 9, 2
_PAGES = 16  # ring buffer data pages per CPU (64 KiB; ~6 KiB per sampled thread arrive per DRAIN_S)
DRAIN_S = 0.05
MAPS_S = 0.25
PERIOD_NS = 250_000  # one sample per 250 us of a thread's CPU time
MAX_SNAPSHOTS = 200  # distinct sets of executable mappings kept; an honest model's process settles after loading

# the runtime a candidate's library may run in: matched on the file's name, and only for files the worker
# itself sees at the same path with the same device and inode (a copy under /tmp with one of these names is not)
RUNTIME = re.compile(r"^(libc|libm|libmvec|libpthread|libdl|librt|ld-linux[-\w.]*|libstdc\+\+|libgcc_s|libgomp[-\w]*|libffi"
                     r"|libpython3[.\d]*|python3[.\d]*)(\.so[.\d]*)?$")
# (a writable folder of the sandbox never holds the runtime; the device/inode test below already refuses a copy there)
WRITABLE = ("/tmp", "/dev/shm", "/var/tmp", "/job")
# the interpreter's own extension modules (select, _json, _ctypes, ...): the protocol's reading and writing
DYNLOAD = os.path.join(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "lib-dynload") + "/"
KERNEL_CODE = ("[vdso]", "[vsyscall]")  # the kernel's clock_gettime page: no compute


class ProfileUnavailable(RuntimeError):
    """perf_event_open refused (kernel.perf_event_paranoid, seccomp of a container): the check cannot run."""

    retriable = False


@dataclass
class Mapping:
    lo: int
    hi: int
    dev: tuple[int, int]
    ino: int
    path: str


@dataclass
class Profile:
    samples: list[tuple[int, int]] = field(default_factory=list)  # (CLOCK_MONOTONIC ns, user-space IP) of `pid`
    maps: list[list[Mapping]] = field(default_factory=list)  # every distinct snapshot of its executable mappings
    lost: int = 0
    period_ns: int = PERIOD_NS
    pid: int = 0  # the process whose samples and maps these are (0: never found)
    churned: bool = False  # its executable mappings changed more than MAX_SNAPSHOTS times: no attribution


def _attr(period_ns: int) -> ctypes.Array:
    buf = bytearray(128)
    struct.pack_into("IIQQQ", buf, 0, _PERF_TYPE_SOFTWARE, 128, _PERF_COUNT_SW_TASK_CLOCK, period_ns,
                     _SAMPLE_IP | _SAMPLE_TID | _SAMPLE_TIME)
    # enabled at open: a thread forked from one already attached inherits a live event, never a switched-off one
    struct.pack_into("Q", buf, 40, _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV | _USE_CLOCKID)
    struct.pack_into("i", buf, 92, time.CLOCK_MONOTONIC)
    return (ctypes.c_char * 128).from_buffer(buf)


_libc = ctypes.CDLL(None, use_errno=True)


def _open(attr, tid: int, cpu: int) -> int:
    if _NR_PERF_EVENT_OPEN is None:
        raise ProfileUnavailable(f"perf_event_open: unknown syscall number on {os.uname().machine}")
    fd = _libc.syscall(_NR_PERF_EVENT_OPEN, attr, tid, cpu, -1, _FLAG_FD_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf_event_open(tid={tid}, cpu={cpu}): {os.strerror(err)}")
    return fd


def _ioctl(fd: int, req: int, arg: int = 0) -> None:
    if _libc.ioctl(fd, req, ctypes.c_ulong(arg)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf ioctl {req:#x}: {os.strerror(err)}")


def tree(root: int) -> list[int]:
    """Every thread of every process under `root` (itself included), as the host numbers them."""
    procs, todo = [], [root]
    while todo:
        pid = todo.pop()
        procs.append(pid)
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:  # gone meanwhile: its children were re-parented, and their own events were inherited
            continue
    tids = []
    for pid in procs:
        try:
            tids += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
    return tids


def read_maps(pid: int) -> list[Mapping]:
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        major, minor = (int(x, 16) for x in parts[3].split(":"))
        out.append(Mapping(lo, hi, (major, minor), int(parts[4]), parts[5].strip() if len(parts) > 5 else ""))
    return out


class Sampler:
    """Task-clock samples of a process tree, from now until stop(). One ring buffer per CPU.

    The samples kept are those of the one process in the tree whose command line holds `marker` (the model's
    server, found before any candidate code loads). `collect=False` keeps the events on (their overhead, so
    that the baselines are timed under the same sampling as the candidate) and reads nothing."""

    def __init__(self, root: int, marker: bytes = b"", period_ns: int = PERIOD_NS, collect: bool = True):
        self.root, self.marker, self.collect = root, marker, collect
        self.prof = Profile(period_ns=period_ns, pid=0 if marker else root)
        self._attr = _attr(period_ns)
        self._fds: list[int] = []
        self._rings: dict[int, tuple[int, mmap.mmap]] = {}  # cpu -> (fd, ring)
        self._attached: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # the model process's pid in every PID namespace it is in: an event inherited inside the sandbox reports
        # pids as the sandbox's namespace numbers them (the forking task's), one attached from here as the host does
        self._pids: set[int] = {root} if not marker else set()

    # ------------------------------------------------------------------ attach
    def start(self) -> "Sampler":
        try:
            for _ in range(50):  # until a scan finds no thread it has not attached: the rest inherit the events
                new = [t for t in tree(self.root) if t not in self._attached]
                if not new:
                    break
                for tid in new:
                    self._attach(tid)
        except OSError as exc:
            self.close()
            raise ProfileUnavailable(str(exc)) from exc
        self._thread = threading.Thread(target=self._loop, name=f"cpu-profile-{self.root}", daemon=True)
        self._thread.start()
        return self

    def _attach(self, tid: int) -> None:
        for cpu in range(os.cpu_count() or 1):
            try:
                fd = _open(self._attr, tid, cpu)
            except OSError as exc:
                if exc.errno == 3:  # ESRCH: the thread ended meanwhile
                    self._attached.add(tid)
                    return
                raise
            self._fds.append(fd)
            if cpu in self._rings:
                _ioctl(fd, _IOC_SET_OUTPUT, self._rings[cpu][0])
            else:
                ring = mmap.mmap(fd, (1 + _PAGES) * mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                self._rings[cpu] = (fd, ring)
        self._attached.add(tid)

    # ------------------------------------------------------------------ read
    def _loop(self) -> None:
        next_maps = 0.0
        while self.collect and not self._stop.wait(DRAIN_S):
            if not self.prof.pid:
                self.prof.pid = _find_process(self.root, self.marker)
                self._pids = _ns_pids(self.prof.pid) if self.prof.pid else set()
            n = len(self.prof.samples)
            self.drain()
            # a sample outside every mapping seen: the code it ran in was mapped since, snapshot it while it is
            if time.monotonic() >= next_maps or any(_find(self.prof.maps[-1:], ip) is None
                                                    for _, ip in self.prof.samples[n:]):
                self.snapshot_maps()
                next_maps = time.monotonic() + MAPS_S

    def snapshot_maps(self) -> None:
        m = read_maps(self.prof.pid) if self.prof.pid else []
        if m:
            with self._lock:
                if not self.prof.maps or self.prof.maps[-1] != m:
                    if len(self.prof.maps) >= MAX_SNAPSHOTS:
                        self.prof.churned = True  # code mapped and unmapped over and over: every sample is foreign
                        return
                    self.prof.maps.append(m)

    def drain(self) -> None:
        with self._lock:
            for _, ring in self._rings.values():
                self._drain_one(ring)

    def _drain_one(self, ring: mmap.mmap) -> None:
        head = struct.unpack_from("Q", ring, 1024)[0]
        tail = struct.unpack_from("Q", ring, 1032)[0]
        size = _PAGES * mmap.PAGESIZE
        base = mmap.PAGESIZE
        samples = self.prof.samples
        while tail < head:
            off = tail % size
            hdr = _wrapped(ring, base, size, off, 8)
            typ, _misc, rsize = struct.unpack("IHH", hdr)
            if rsize == 0:
                break
            if typ == _RECORD_SAMPLE:
                ip, pid, _tid, t = struct.unpack("QIIQ", _wrapped(ring, base, size, (off + 8) % size, 24))
                if pid in self._pids:
                    samples.append((t, ip))
            elif typ == _RECORD_LOST:
                self.prof.lost += struct.unpack("QQ", _wrapped(ring, base, size, (off + 8) % size, 16))[1]
            tail += rsize
        struct.pack_into("Q", ring, 1032, tail)

    def stop(self) -> Profile:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.collect:
            self.snapshot_maps()
            self.drain()
        self.close()
        return self.prof

    def close(self) -> None:
        for _, ring in self._rings.values():
            ring.close()
        self._rings = {}
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def _wrapped(ring: mmap.mmap, base: int, size: int, off: int, n: int) -> bytes:
    if off + n <= size:
        return ring[base + off: base + off + n]
    first = size - off
    return ring[base + off: base + size] + ring[base: base + n - first]


# ---------------------------------------------------------------------- attribution
def trusted_files(maps: list[list[Mapping]], own: tuple[int, int] | None) -> set[tuple[tuple[int, int], int]]:
    """(device, inode) of the mapped files that count as the candidate's own: its library, and the runtime (RUNTIME)
    where the worker finds the very same file at the same path outside any writable folder."""
    ok: set = set()
    for snap in maps:
        for m in snap:
            key = (m.dev, m.ino)
            if key in ok or m.ino == 0 or not m.path.startswith("/"):  # anonymous memory is nobody's library
                continue
            if own is not None and (os.major(own[0]), os.minor(own[0])) == m.dev and own[1] == m.ino:
                ok.add(key)
                continue
            if not (RUNTIME.match(os.path.basename(m.path)) or m.path.startswith(DYNLOAD)) or m.path.startswith(WRITABLE):
                continue
            try:
                st = os.stat(m.path)
            except OSError:
                continue
            if (os.major(st.st_dev), os.minor(st.st_dev)) == m.dev and st.st_ino == m.ino:
                ok.add(key)
    return ok


def foreign_time(prof: Profile, windows: list[list[int]], own_file: str | None, skip_calls: int = 2) -> dict:
    """The sampled CPU time of `prof.pid` inside the judge's run round trips (`windows`: [t0 ns, t1 ns, calls],
    CLOCK_MONOTONIC; the first `skip_calls` calls left out: first-call set-up inside torch), split into its own code
    and runtime and the rest (`foreign`), per call, with the files the foreign time went to."""
    own = None
    if own_file:
        try:
            st = os.stat(own_file)
            own = (st.st_dev, st.st_ino)
        except OSError:
            own = None
    ok = trusted_files(prof.maps, own)
    wins, skipped = [], 0
    for w0, w1, b in sorted(windows):
        if skipped < skip_calls:
            skipped += b
            continue
        wins.append((w0, w1, b))
    calls = sum(b for _, _, b in wins)
    spans = [(w0, w1) for w0, w1, _ in wins]
    per = prof.period_ns / 1e9
    own_s = foreign_s = 0.0
    library_n = 0
    lib_key = ((os.major(own[0]), os.minor(own[0])), own[1]) if own is not None else None
    where: dict[str, float] = {}
    index = [([x.lo for x in snap], snap) for snap in prof.maps]
    for t, ip in prof.samples:
        if not _inside(spans, t):
            continue
        m = _find(prof.maps, ip)
        if prof.churned:
            name = "[executable mappings changed too often]"
        elif m is not None and len(index) > 1 and _remapped(index, ip, m):
            # another file was mapped at this address in another snapshot: which one ran here is not known
            name = "[remapped]"
        elif m is not None and (m.path in KERNEL_CODE or (m.ino != 0 and (m.dev, m.ino) in ok)):
            own_s += per
            library_n += (m.dev, m.ino) == lib_key and m.ino != 0
            continue
        else:
            name = (m.path or "[anonymous]") if m is not None else "[unmapped]"
        foreign_s += per
        where[name] = where.get(name, 0.0) + per
    top = dict(sorted(where.items(), key=lambda kv: -kv[1])[:4])
    return {"calls": calls, "windows_s": round(sum(w1 - w0 for w0, w1 in spans) / 1e9, 6),
            "own_s": round(own_s, 6), "foreign_s": round(foreign_s, 6),
            "library_s": round(library_n * per, 6), "library_samples": library_n,
            "foreign_samples": int(round(foreign_s / per)) if per else 0,
            "foreign_per_call_s": round(foreign_s / calls, 9) if calls else 0.0,
            "samples": len(prof.samples), "lost": prof.lost, "period_s": per,
            "foreign_in": {k: round(v, 6) for k, v in top.items()}}


def _find(snaps: list[list[Mapping]], ip: int) -> Mapping | None:
    """The mapping holding `ip` in the newest snapshot that has one (each snapshot is sorted by address)."""
    for snap in reversed(snaps):
        i = bisect.bisect_right(snap, ip, key=lambda m: m.lo) - 1
        if i >= 0 and snap[i].lo <= ip < snap[i].hi:
            return snap[i]
    return None


def _remapped(index: list[tuple[list[int], list[Mapping]]], ip: int, m: Mapping) -> bool:
    """Whether some snapshot maps `ip` to another file than `m` (code swapped in and out between snapshots)."""
    for los, snap in index:
        i = bisect.bisect_right(los, ip) - 1
        if i >= 0 and snap[i].lo <= ip < snap[i].hi and (snap[i].dev, snap[i].ino, snap[i].path) != (m.dev, m.ino, m.path):
            return True
    return False


def _ns_pids(pid: int) -> set[int]:
    """`pid` as each PID namespace it is in numbers it (/proc/PID/status NSpid: host first, innermost last)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return {int(x) for x in line.split()[1:]}
    except OSError:
        pass
    return {pid}


def _find_process(root: int, marker: bytes) -> int:
    """The process running `python -m <marker>` (not the sandbox's launchers, whose arguments name it too)."""
    for tid in tree(root):
        try:
            with open(f"/proc/{tid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[1:3] == [b"-m", marker]:
            return tid
    return 0


def _inside(wins: list[tuple[int, int]], t: int) -> bool:
    i = bisect.bisect_right(wins, (t, 1 << 63)) - 1
    return i >= 0 and wins[i][0] <= t <= wins[i][1]


def available() -> str:
    """'' when this process may sample a child of its own; else why not (the check then cannot run)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        Sampler(child.pid).start().stop()
        return ""
    except ProfileUnavailable as exc:
        return str(exc)
    finally:
        child.kill()
        child.wait()


# ---------------------------------------------------------------------- the rule
NO_SAMPLES = "the CPU profile saw none of the model process's CPU time"  # session.py; evaluator retries once
TORCH_COMPUTE = "torch_compute"  # the violation's name (the in-process guard's too: candidate/policy.py)


def enabled(sb, backend: str) -> bool:
    """sandbox.cpu_profile: "auto" is on for the CPU backend only (on CUDA the host waits in the driver while the
    GPU computes: host time says nothing about who computed)."""
    mode = getattr(sb, "cpu_profile", "auto")
    return mode == "on" or (mode == "auto" and backend == "cpu")


def foreign_compute(summary: dict, t_ref: float | None, floor_s: float, fraction: float) -> str:
    """Why the candidate's foreign CPU time per call is compute (a violation), or ''. Judged on the time less three
    standard errors of its sample count: a few samples of glue over a few checked calls are not compute."""
    per = float(summary.get("foreign_per_call_s") or 0.0)
    n = int(summary.get("foreign_samples") or 0)
    sure = per * max(0.0, 1.0 - 3.0 / n ** 0.5) if n else 0.0
    ref = float(t_ref) if isinstance(t_ref, (int, float)) and t_ref > 0 else 0.0
    limit = max(floor_s, fraction * ref)
    if not summary.get("calls") or sure <= limit:
        return ""
    names = ", ".join(f"{os.path.basename(k) or k} {v * 1e3:.1f} ms" for k, v in (summary.get("foreign_in") or {}).items())
    of_ref = f", {fraction:g} of the reference's {ref * 1e3:.3f} ms" if ref else ""
    return (f"ModelNew ran {per * 1e3:.3f} ms of CPU time per call outside its own library and the C/C++/OpenMP "
            f"runtime while the judge ran it ({names}; measured from outside its process), above the "
            f"{limit * 1e3:.3f} ms allowed{of_ref}: torch's or another library's kernels computed the task; "
            "ModelNew's arithmetic must run in the solution's own kernels")


def compute_floor(summary: dict | None, cores: int) -> float:
    """A time per call the candidate's kernels cannot have beaten: its own library's CPU seconds per call spread over
    every core the host has, less three standard errors of the sample count (so an honest kernel that keeps every
    core busy is not charged for sampling noise). 0 when there is nothing to go on."""
    if not summary or not summary.get("calls") or not summary.get("library_samples"):
        return 0.0
    n = int(summary["library_samples"])
    keep = max(0.0, 1.0 - 3.0 / n ** 0.5)
    return float(summary["library_s"]) / int(summary["calls"]) / max(1, cores) * keep
