"""Where a sandboxed process spends its CPU time, measured from outside it: perf task-clock samples.

The trusted worker attaches software task-clock sampling events (`perf_event_open`, user-space
instruction pointers only) to every thread of the candidate's process tree, before any candidate
code is loaded, with `inherit` so the threads it creates later are followed too (cpu_sampler.py:
the launcher's tree at once, then the model's process itself). Each sample is
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
import logging
import os
import re
import sys

from sandbox_workers.cpu_sampler import NO_SAMPLE_IP, Mapping, Profile, ProfileUnavailable, Sampler, find

log = logging.getLogger(__name__)
__all__ = ["Mapping", "Profile", "ProfileUnavailable", "Sampler", "foreign_time", "foreign_compute", "compute_floor"]

# the runtime a candidate's library may run in: matched on the file's name, and only for files the worker
# itself sees at the same path with the same device and inode (a copy under /tmp with one of these names is not)
RUNTIME = re.compile(r"^(libc|libm|libmvec|libpthread|libdl|librt|ld-linux[-\w.]*|libstdc\+\+|libgcc_s|libgomp[-\w]*|libffi"
                     r"|libpython3[.\d]*|python3[.\d]*)(\.so[.\d]*)?$")
# (a writable folder of the sandbox never holds the runtime; the device/inode test below already refuses a copy there)
WRITABLE = ("/tmp", "/dev/shm", "/var/tmp", "/job")
# the interpreter's own extension modules (select, _json, _ctypes, ...): the protocol's reading and writing
DYNLOAD = os.path.join(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "lib-dynload") + "/"
KERNEL_CODE = ("[vdso]", "[vsyscall]")  # the kernel's clock_gettime page: no compute
# A sample weighs its thread's CPU time since its previous sample, and samples that fire in the kernel are dropped
# (user-space instruction pointers only), so one user-mode sample can stand for milliseconds of kernel work before it:
# the munmap of a freed tensor, page faults. Those landed on torch's glue after an honest call (a sample of several
# ms in libtorch_python.so: 1.1-1.5 ms per call against the 1 ms floor, with nothing computed there). Each dropped sample
# says the thread was in the kernel at that instant, so a heavy sample's user time is about one period: a located
# sample counts as foreign for at most this many periods (the VM's late timer: p99 of all weights ~3 periods). Not
# where records were lost (the next sample then carries the lost ones' time, wherever it was spent).
HEAVY_SAMPLE_PERIODS = 4




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
    own_s = foreign_s = library_s = kernel_s = 0.0
    cap = HEAVY_SAMPLE_PERIODS * per
    library_n = foreign_n = 0
    lib_key = ((os.major(own[0]), os.minor(own[0])), own[1]) if own is not None else None
    where: dict[str, float] = {}
    index = [([x.lo for x in snap], snap) for snap in prof.maps]
    for s in prof.samples:
        t, ip = s[0], s[1]
        if not _inside(spans, t):
            continue
        w = s[2] / 1e9 if len(s) > 2 else per  # the thread's CPU time this sample stands for
        m = find(prof.maps, ip)
        if prof.churned:
            name = "[executable mappings changed too often]"
        elif ip == NO_SAMPLE_IP:
            name = "[threads that ended before a sample]"
        elif m is not None and len(index) > 1 and _remapped(index, ip, m):
            # another file was mapped at this address in another snapshot: which one ran here is not known
            name = "[remapped]"
        elif m is not None and (m.path in KERNEL_CODE or (m.ino != 0 and (m.dev, m.ino) in ok)):
            own_s += w
            if (m.dev, m.ino) == lib_key and m.ino != 0:
                library_n += 1
                library_s += w
            continue
        else:
            name = (m.path or "[anonymous]") if m is not None else "[unmapped]"
            if m is not None and not prof.lost and w > cap:
                kernel_s += w - cap
                w = cap
        foreign_s += w
        foreign_n += 1
        where[name] = where.get(name, 0.0) + w
    top = dict(sorted(where.items(), key=lambda kv: -kv[1])[:4])
    return {"calls": calls, "windows_s": round(sum(w1 - w0 for w0, w1 in spans) / 1e9, 6),
            "own_s": round(own_s, 6), "foreign_s": round(foreign_s, 6),
            "library_s": round(library_s, 6), "library_samples": library_n,
            "foreign_samples": foreign_n, "foreign_kernel_s": round(kernel_s, 6),
            "foreign_per_call_s": round(foreign_s / calls, 9) if calls else 0.0,
            "samples": len(prof.samples), "lost": prof.lost, "period_s": per, "threads_attached": prof.threads,
            "foreign_in": {k: round(v, 6) for k, v in top.items()}}


def _remapped(index: list[tuple[list[int], list[Mapping]]], ip: int, m: Mapping) -> bool:
    """Whether some snapshot maps `ip` to another file than `m` (code swapped in and out between snapshots)."""
    for los, snap in index:
        i = bisect.bisect_right(los, ip) - 1
        if i >= 0 and snap[i].lo <= ip < snap[i].hi and (snap[i].dev, snap[i].ino, snap[i].path) != (m.dev, m.ino, m.path):
            return True
    return False


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
