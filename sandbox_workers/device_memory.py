"""Admission of evaluation jobs to one device by the memory they take, so that jobs in flight together fit on it.

With ``sandbox.jobs_per_device`` > 1 a device runs several jobs at once; KernelBench's own shapes make a job's
footprint task-specific (level-1 19_ReLU holds ~25 GB: the judge's inputs, expected outputs and the device arena),
and four such jobs on an 80 GB H100 ran out of memory (docs/oracle-gpu.md, "Through Kafka"). Each job's need is
what the trusted judges of its task's last job reported (their own peak device memory and arena: never a number
from candidate code; the evaluator keeps it beside the task's baselines); a task not seen yet runs alone, and a
job that ran out of memory next to others runs again alone. Jobs are admitted in arrival order, with bounded
backfilling: while the oldest waiting job does not fit, a later one that does may go first, at most BACKFILL of them
per oldest job (so a large job waits for at most that many small ones, and the device is not left to one large job
while small ones queue behind another: the GPU's idle gaps of docs/oracle-gpu.md "Session 17").
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

log = logging.getLogger(__name__)

GB = 1 << 30
MARGIN = 1.25  # a candidate's own allocations come on top of its judge's report (and are not trusted anyway)
CONTEXT_BYTES = 1 << 30  # the two CUDA contexts (judge and model process) of a session
BACKFILL = 4  # later jobs admitted ahead of the oldest waiting one while it does not fit


class MemoryBudget:
    """Bytes held by the jobs in flight on one device, granted first come, first served."""

    def __init__(self, total_bytes: int):
        self.total = int(total_bytes)
        self._cv = threading.Condition()
        self._in_use = 0
        self._jobs = 0
        self._queue: list[int] = []  # tickets waiting, oldest first
        self._wants: dict[int, int] = {}  # ticket -> bytes it asks for
        self._passed = 0  # jobs admitted ahead of the oldest waiting one (backfilled)
        self._next = 0
        self._need: dict[str, int] = {}  # task key -> bytes one job of it holds (learned)

    def need(self, key: str) -> int | None:
        """Bytes a job of this task holds, or None when unknown (the job runs alone)."""
        with self._cv:
            return self._need.get(key)

    def learn(self, key: str, reported_bytes: int) -> None:
        """A job of this task finished: its judges reported this many bytes (the largest session's)."""
        if reported_bytes <= 0:
            return
        with self._cv:
            self._need[key] = int(reported_bytes * MARGIN) + CONTEXT_BYTES

    def forget(self, key: str) -> None:
        """The estimate was too small (the job ran out of memory): its next job runs alone."""
        with self._cv:
            self._need.pop(key, None)

    @contextmanager
    def hold(self, need: int | None):
        """Wait for room (None or more than the budget: an empty device), hold it for the block. Yields a record
        for the job's evidence: need_bytes, alone, waited_s, and the monotonic grant and release (t0, t1)."""
        alone = need is None or need > self.total
        want = self.total if alone else int(need)
        t0 = time.monotonic()
        with self._cv:
            ticket = self._next
            self._next += 1
            self._queue.append(ticket)
            self._wants[ticket] = want
            while not self._may_enter(ticket):
                self._cv.wait()
            backfilled = self._queue[0] != ticket
            self._passed = self._passed + 1 if backfilled else 0
            self._queue.remove(ticket)
            del self._wants[ticket]
            self._in_use += want
            self._jobs += 1
            self._cv.notify_all()  # the next in line may fit too
        granted = time.monotonic()
        rec = {"need_bytes": None if need is None else int(need), "alone": alone, "backfilled": backfilled,
               "waited_s": round(granted - t0, 6), "budget_bytes": self.total, "t0": granted}
        try:
            yield rec
        finally:
            rec["t1"] = time.monotonic()
            with self._cv:
                self._in_use -= want
                self._jobs -= 1
                self._cv.notify_all()

    def _fits(self, ticket: int) -> bool:
        return self._jobs == 0 or self._in_use + self._wants[ticket] <= self.total

    def _may_enter(self, ticket: int) -> bool:
        """(lock held) The oldest waiting job enters when it fits; a later one when it fits, the oldest does not,
        fewer than BACKFILL have passed the oldest, and no job between them fits (arrival order among the rest)."""
        if not self._fits(ticket):
            return False
        head = self._queue[0]
        if head == ticket:
            return True
        if self._fits(head) or self._passed >= BACKFILL:
            return False
        for t in self._queue[1:]:
            if t == ticket:
                return True
            if self._fits(t):
                return False
        return False


def device_total_bytes(backend: str) -> int:
    """The memory of the device this process is pinned to (CUDA, NVML; 0 on CPU or when unknown)."""
    if backend != "cuda":
        return 0
    try:
        import pynvml

        from sandbox_workers.device_gate import _nvml_handle

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(_nvml_handle(pynvml)).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - no pynvml, no driver, pynvml.NVMLError's many subclasses
        log.warning("device memory unknown (%s: %s): jobs are admitted without a memory budget",
                    type(exc).__name__, exc)
        return 0


def budget_for(sb, backend: str, jobs: int) -> MemoryBudget | None:
    """``sandbox.job_memory_budget_gb``: > 0 that many GB on any backend; 0 none; < 0 (default) on CUDA
    ``sandbox.device_memory_fraction`` of the device's memory, none on CPU. None also for one job per device.
    Nothing is set aside for pre-started sessions: their processes touch the device only once their job starts
    (serve.py's lock_down, the judge's first CUDA call), inside that job's hold (tests/sandbox/test_gpu_pool.py).
    Setting 1 GB aside per pre-started session, as before, took 16 GB of an 80 GB H100 at the defaults and ran
    KernelBench's largest level-1 tasks alone (docs/oracle-gpu.md "Session 20")."""
    gb = float(getattr(sb, "job_memory_budget_gb", -1.0))
    if jobs <= 1 or gb == 0:
        return None
    if gb > 0:
        return MemoryBudget(int(gb * GB))
    total = device_total_bytes(backend)
    if not total:
        return None
    budget = int(total * float(getattr(sb, "device_memory_fraction", 0.9)))
    log.info("device memory budget for %d jobs: %.1f GB of %.1f GB", jobs, budget / GB, total / GB)
    return MemoryBudget(max(budget, CONTEXT_BYTES))
