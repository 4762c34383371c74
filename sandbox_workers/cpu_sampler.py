"""Task-clock samples of one sandboxed process, taken from outside it (perf_event_open): the raw data of cpu_profile.

The events are attached in two steps, because neither alone is certain to reach the process that matters (the model's
server, a grandchild of the sandbox's launcher) exactly once:

1. `start()`, right after the spawn: every thread of the launcher's tree, with `inherit`, so the server has events from
   its first instruction even if it is born a microsecond later. This step alone left the server without samples in a
   few % of CI's sessions; the likely cause: a scan of /proc misses a child being forked while its parent is attached
   (the kernel copies the parent's events at fork, /proc lists the child a little later, and its `children` file is
   not stable while the tree changes).
2. once the server is found (by its command line, long before any candidate code loads: it is still importing torch),
   every thread of it is attached directly, and then the launcher-tree events are switched off (an ioctl on an event
   reaches its inherited copies too). From then on each of its threads carries one live event: two would double the
   sampling cost (5-8 % of a busy thread's CPU time each on this VM: docs/sandbox/cpu_sampler_overhead.txt) and the
   counts. Its later threads inherit the direct events. Samples are kept only from the direct events (a sample names
   its top-level event: PERF_SAMPLE_ID).

A thread of the server born while its direct events were being attached may carry neither: each later pass attaches any
thread not attached yet whose start time (/proc/TID/stat) is not clearly after the last attach (one that had inherited
them after all is then counted twice: charged to the candidate, never hidden).

Each sample weighs its thread's CPU time since its previous sample (the event's count, PERF_SAMPLE_READ); when an
inherited event's thread exits it reports its final count (PERF_RECORD_READ), so a thread that never ran a whole
period, or the tail after its last sample, is not lost.
"""
from __future__ import annotations

import bisect
import ctypes
import logging
import mmap
import os
import struct
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(os.uname().machine)
_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_TASK_CLOCK = 1, 1
_SAMPLE_IP, _SAMPLE_TID, _SAMPLE_TIME, _SAMPLE_READ, _SAMPLE_ID = 1, 2, 4, 16, 64
_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV, _INHERIT_STAT, _SAMPLE_ID_ALL, _USE_CLOCKID = 1 << 1, 1 << 5, 1 << 6, 1 << 11, 1 << 18, 1 << 25
_FLAG_FD_CLOEXEC = 1 << 3
_IOC_DISABLE, _IOC_SET_OUTPUT, _IOC_ID = 0x2401, 0x2405, 0x80082407
_RECORD_SAMPLE, _RECORD_LOST, _RECORD_READ = 9, 2, 8
NO_SAMPLE_IP = 0  # a thread's CPU time that no sample of it located (see _drain_one): foreign
_PAGES = 32  # ring buffer data pages per CPU (128 KiB: ~3k samples, ~0.8 s of one busy thread between drains)
DRAIN_S = 0.05
MAPS_S = 0.25
PERIOD_NS = 250_000  # one sample per 250 us of a thread's CPU time
MAX_SNAPSHOTS = 200  # distinct sets of executable mappings kept; an honest model's process settles after loading
_TICK = os.sysconf("SC_CLK_TCK")


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
    # (CLOCK_MONOTONIC ns, user-space IP, ns of the thread's CPU time since its previous sample) of `pid`
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    maps: list[list[Mapping]] = field(default_factory=list)  # every distinct snapshot of its executable mappings
    lost: int = 0
    period_ns: int = PERIOD_NS
    pid: int = 0  # the process whose samples and maps these are (0: never found)
    churned: bool = False  # its executable mappings changed more than MAX_SNAPSHOTS times: no attribution
    threads: int = 0  # threads of it attached directly (step 2 above)
    error: str = ""  # why its own events could not be attached (then it has no samples)


def _attr(period_ns: int) -> ctypes.Array:
    buf = bytearray(128)
    struct.pack_into("IIQQQ", buf, 0, _PERF_TYPE_SOFTWARE, 128, _PERF_COUNT_SW_TASK_CLOCK, period_ns,
                     _SAMPLE_IP | _SAMPLE_TID | _SAMPLE_TIME | _SAMPLE_ID | _SAMPLE_READ)
    # enabled at open: a thread forked from one already attached inherits a live event, never a switched-off one;
    # inherit_stat: an inherited event reports its final count when its thread exits (PERF_RECORD_READ)
    struct.pack_into("Q", buf, 40, _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV | _INHERIT_STAT | _SAMPLE_ID_ALL | _USE_CLOCKID)
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


def _ioctl(fd: int, req: int, arg=0) -> None:
    if _libc.ioctl(fd, req, arg if isinstance(arg, ctypes._Pointer) else ctypes.c_ulong(arg)) < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"perf ioctl {req:#x}: {os.strerror(err)}")


def _event_id(fd: int) -> int:
    out = ctypes.c_uint64(0)
    _ioctl(fd, _IOC_ID, ctypes.pointer(out))
    return out.value


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
        tids += threads(pid)
    return tids


def threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


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
    """Task-clock samples of a process tree's one process of interest, from now until stop(). One ring per CPU.

    The samples kept are those of the process in the tree whose command line is `python -m <marker>` (found before
    any candidate code loads), or of `root` itself without a marker. `collect=False` keeps the launcher-tree events on
    (their overhead, so that the baselines are timed under the same sampling as the candidate) and reads nothing."""

    def __init__(self, root: int, marker: bytes = b"", period_ns: int = PERIOD_NS, collect: bool = True):
        self.root, self.marker, self.collect = root, marker, collect
        self.prof = Profile(period_ns=period_ns)
        self._attr = _attr(period_ns)
        self._tree_fds: list[int] = []  # step 1's events (switched off by step 2)
        self._fds: list[int] = []  # step 2's
        self._rings: dict[int, tuple[int, mmap.mmap]] = {}  # cpu -> (fd, ring)
        self._attached: set[int] = set()  # threads of the launcher's tree (step 1)
        self._direct: set[int] = set()  # threads of the process attached directly (step 2)
        self._direct_ids: set[int] = set()  # their events' ids: the only samples kept
        self._later: set[int] = set()  # threads born after an attach: they inherited the direct events
        self._last_count: dict[tuple[int, int, int], int] = {}  # (thread, cpu, event id) -> count at its last sample
        self._last_ip: dict[tuple[int, int, int], int] = {}  # ... and where that sample was
        self._last_attach_tick = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pid = 0

    # ------------------------------------------------------------------ attach
    def start(self) -> "Sampler":
        try:
            if not self.marker:  # the root is the process: step 2 at once
                self._take_over(self.root)
            for _ in range(50 if self.marker else 0):  # until a scan finds no new thread: the rest inherit the events
                new = [t for t in self._initial_tids() if t not in self._attached]
                if not new:
                    break
                for tid in new:
                    self._tree_fds += self._attach(tid)
                    self._attached.add(tid)
        except OSError as exc:
            self.close()
            raise ProfileUnavailable(str(exc)) from exc
        if self.collect:
            self._thread = threading.Thread(target=self._loop, name=f"cpu-profile-{self.root}", daemon=True)
            self._thread.start()
        return self

    def _initial_tids(self) -> list[int]:
        return tree(self.root)

    def _attach(self, tid: int) -> list[int]:
        """One event per CPU on `tid` (none if it ended meanwhile), written to that CPU's ring."""
        fds = []
        for cpu in range(os.cpu_count() or 1):
            try:
                fd = _open(self._attr, tid, cpu)
            except OSError as exc:
                if exc.errno == 3:  # ESRCH: the thread ended meanwhile
                    return fds
                raise
            fds.append(fd)
            if cpu in self._rings:
                _ioctl(fd, _IOC_SET_OUTPUT, self._rings[cpu][0])
            else:
                ring = mmap.mmap(fd, (1 + _PAGES) * mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                self._rings[cpu] = (fd, ring)
        return fds

    def _attach_direct(self, tids: list[int]) -> None:
        for tid in tids:
            fds = self._attach(tid)
            ids = {_event_id(fd) for fd in fds}
            with self._lock:
                self._fds += fds
                self._direct_ids |= ids
            self._direct.add(tid)
        self._last_attach_tick = time.clock_gettime(time.CLOCK_BOOTTIME) * _TICK
        self.prof.threads = len(self._direct)

    def _take_over(self, pid: int) -> None:
        """Step 2: the process's threads get events of their own; the launcher tree's are switched off."""
        for _ in range(50):
            new = [t for t in threads(pid) if t not in self._direct]
            if not new:
                break
            self._attach_direct(new)
        for fd in self._tree_fds:
            _ioctl(fd, _IOC_DISABLE)
        self._pid = self.prof.pid = pid

    def _follow(self) -> None:
        """Attach threads that may have been born while their creator was being attached (see the module's note)."""
        late = []
        for t in threads(self._pid):
            if t in self._direct or t in self._later:
                continue
            if _start_tick(self._pid, t) > self._last_attach_tick + 2:  # clock ticks: born after, so it inherited
                self._later.add(t)
            else:
                late.append(t)
        if late:
            log.info("cpu profile of %d: %d thread(s) born during the attach, attached now", self._pid, len(late))
            self._attach_direct(late)

    # ------------------------------------------------------------------ read
    def _loop(self) -> None:
        next_maps = 0.0
        while not self._stop.wait(DRAIN_S):
            try:
                if not self._pid:
                    pid = _find_process(self.root, self.marker)
                    if pid:
                        self._take_over(pid)
                elif time.monotonic() >= next_maps:
                    self._follow()
            except OSError as exc:  # refused (then no samples: the evaluation fails closed), or the process ended
                self.prof.error = str(exc)
                log.warning("cpu profile of %d: %s", self.root, exc)
            n = len(self.prof.samples)
            self.drain()
            # a sample outside every mapping seen: the code it ran in was mapped since, snapshot it while it is
            if time.monotonic() >= next_maps or any(ip != NO_SAMPLE_IP and find(self.prof.maps[-1:], ip) is None
                                                    for _, ip, _w in self.prof.samples[n:]):
                self.snapshot_maps()
                next_maps = time.monotonic() + MAPS_S

    def snapshot_maps(self) -> None:
        m = read_maps(self._pid) if self._pid else []
        if m:
            with self._lock:
                if not self.prof.maps or self.prof.maps[-1] != m:
                    if len(self.prof.maps) >= MAX_SNAPSHOTS:
                        self.prof.churned = True  # code mapped and unmapped over and over: every sample is foreign
                        return
                    self.prof.maps.append(m)

    def drain(self) -> None:
        with self._lock:
            for cpu, (_, ring) in self._rings.items():
                self._drain_one(cpu, ring)

    def _drain_one(self, cpu: int, ring: mmap.mmap) -> None:
        head = struct.unpack_from("Q", ring, 1024)[0]
        tail = struct.unpack_from("Q", ring, 1032)[0]
        size = _PAGES * mmap.PAGESIZE
        base = mmap.PAGESIZE
        samples, keep, last, where = self.prof.samples, self._direct_ids, self._last_count, self._last_ip
        while tail < head:
            off = tail % size
            typ, _misc, rsize = struct.unpack("IHH", _wrapped(ring, base, size, off, 8))
            if rsize == 0:
                break
            if typ == _RECORD_SAMPLE:
                ip, pid, tid, t, eid, count = struct.unpack("QIIQQQ", _wrapped(ring, base, size, (off + 8) % size, 40))
                if eid in keep and pid == self._pid:  # its own events (and inherited copies)
                    # the thread's CPU time since its previous sample on this CPU, as the event counted it: the
                    # timer behind the samples fires late and irregularly on a VM (a sample per ~3 periods here). A
                    # count below the last one is a new thread under a reused id (pid_max can be 32768): its count
                    # is all its own, never a negative weight that would cancel another thread's time
                    key = (tid, cpu, eid)
                    prev = last.get(key, 0)
                    samples.append((t, ip, count - prev if count >= prev else count))
                    last[key], where[key] = count, ip
            elif typ == _RECORD_READ:  # an inherited event's thread exited: the CPU time since its last sample
                pid, tid, count, _p, _t, t, eid = struct.unpack("IIQIIQQ", _wrapped(ring, base, size, (off + 8) % size, 40))
                key = (tid, cpu, eid)
                if eid in keep and pid == self._pid and count > last.get(key, 0):
                    # a thread that never ran a whole sampling period (many short threads could run torch unseen
                    # that way) has no sample to say where its time went: foreign (NO_SAMPLE_IP maps to nothing)
                    samples.append((t, where.get(key, NO_SAMPLE_IP), count - last.get(key, 0)))
                last.pop(key, None)
                where.pop(key, None)
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
        with self._lock:
            for _, ring in self._rings.values():
                ring.close()
            self._rings = {}
            for fd in self._tree_fds + self._fds:
                os.close(fd)
            self._tree_fds, self._fds = [], []


def _wrapped(ring: mmap.mmap, base: int, size: int, off: int, n: int) -> bytes:
    if off + n <= size:
        return ring[base + off: base + off + n]
    first = size - off
    return ring[base + off: base + size] + ring[base: base + n - first]


def find(snaps: list[list[Mapping]], ip: int) -> Mapping | None:
    """The mapping holding `ip` in the newest snapshot that has one (each snapshot is sorted by address)."""
    for snap in reversed(snaps):
        i = bisect.bisect_right(snap, ip, key=lambda m: m.lo) - 1
        if i >= 0 and snap[i].lo <= ip < snap[i].hi:
            return snap[i]
    return None


def _start_tick(pid: int, tid: int) -> float:
    """When the thread was born, in clock ticks since boot (/proc/PID/task/TID/stat field 22); inf if gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            return float(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return float("inf")


def _find_process(root: int, marker: bytes) -> int:
    """The process running `python -m <marker>` (not the sandbox's launchers, whose arguments name it too)."""
    for tid in tree(root):
        try:
            with open(f"/proc/{tid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{tid}/status") as f:
                tgid = next(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
        except (OSError, StopIteration):
            continue
        if argv[1:3] == [b"-m", marker]:
            return tgid
    return 0
