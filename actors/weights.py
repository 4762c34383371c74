"""Follow the weights topic and hot-swap each newer, verified policy version into the engine.

Every actor reads all announcements (its own consumer group, from the start),
so a fresh actor catches up to the newest version at once. A version is applied
only after ``cluster.weights.transport.receive`` has assembled and checked it (a
"buckets" version: after every bucket, received into memory by cluster.weights.buckets and
checked, is staged in the engine, then all are loaded inside one pause, with no file written
or read; while the learner sends deltas, the last version's buckets are kept to decode the
next one's); a corrupt or missing version is skipped with an error and the old weights keep
serving. Episodes waiting on tools are untouched: the swap only pauses the
engine, which keeps its in-flight requests.

Receiving is bounded: an error that says a retry can help (a timeout, an unreachable
weight server) is retried ``RECEIVE_ATTEMPTS`` times, then the version is given up; a
stop request interrupts a receive; a version given up no longer counts as newer for
admission control, so a forged announcement cannot stall sampling.
"""
from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from cluster.errors import RetriableError, is_retriable
from schemas import topics as T
from schemas.messages import WeightAnnouncement

from cluster import metrics

log = logging.getLogger(__name__)

RECEIVE_TIMEOUT_S = 300.0  # per attempt; a stop request ends it sooner
RECEIVE_ATTEMPTS = 3


class WeightFollower:
    def __init__(self, bus: Any, cfg: Any, policy: Any, actor_id: str, dest_root: Path,
                 executor: Any = None):
        from cluster.weights.transport import VersionGate

        self.bus, self.cfg, self.policy, self.actor_id = bus, cfg, policy, actor_id
        self.dest_root = Path(dest_root)
        self.gate = VersionGate(applied=policy.version)
        self.model_name = cfg.learner.model_name
        self.executor = executor
        self.errors: list[str] = []
        self.applied: list[dict] = []
        self.learner_steps = 0  # the learner steps done when the applied version was made (ann.step)
        self.pending: dict[int, Any] = {}  # version -> its record: announced newer than the engine's, not given up
        self.attempts: dict[int, int] = {}
        self.retry_at: dict[int, float] = {}
        self._stop: asyncio.Event | None = None
        # The buckets of the last in-memory version received, while the learner sends deltas (an announcement's
        # delta_codec): the base they decode against. One version's bytes (SmolLM2-135M: 538 MB in float32),
        # kept only then; dropped when a version comes without deltas.
        self.held = None

    @property
    def lag(self) -> int:
        return max(0, max(self.pending, default=self.policy.version) - self.policy.version)

    def _due(self) -> Any:
        """The newest pending version's record, unless it waits out a retry's back-off (then nothing yet)."""
        if not self.pending:
            return None
        rec = self.pending[max(self.pending)]
        return rec if time.monotonic() >= self.retry_at.get(rec.msg.version, 0.0) else None

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        self._stop = stop
        group = f"{self.cfg.bus.topic_prefix}weights-{self.actor_id}"
        cons = await loop.run_in_executor(self.executor, lambda: self.bus.consumer(
            [T.WEIGHTS], group, expected=WeightAnnouncement, auto_offset_reset="earliest"))
        try:
            while not stop.is_set():
                try:
                    recs = await loop.run_in_executor(self.executor, lambda: cons.poll(timeout_s=0.3))
                except RetriableError as exc:  # broker away: keep serving the current weights, retry
                    log.warning("weights poll failed (%s); retrying", exc)
                    await asyncio.sleep(1.0)
                    continue
                for rec in recs:
                    ann = rec.msg
                    if ann.model_name != self.model_name:
                        continue
                    if self.gate.wants(ann):
                        self.pending[ann.version] = rec
                due = self._due()
                if due is not None:
                    await self.apply(due)
                if recs:
                    await loop.run_in_executor(self.executor, cons.commit)
        finally:
            await loop.run_in_executor(self.executor, cons.close)

    def _receive(self, ann: WeightAnnouncement):
        """Assemble + verify; a stale folder of the same version (an earlier run's) is replaced once."""
        import shutil

        from cluster.weights.transport import WeightsCorrupt, receive, version_dir

        stop = self._stop
        cancelled = (lambda: stop.is_set()) if stop is not None else None
        try:
            return receive(self.bus, ann, str(self.dest_root), RECEIVE_TIMEOUT_S, cancelled,
                           keep=self.cfg.actor.weights_keep)
        except WeightsCorrupt:
            stale = version_dir(self.dest_root, ann.model_name, ann.version)
            if ann.transport == "fs" or not stale.exists():  # fs folders are the source itself
                raise
            log.warning("weights v%d: %s holds other bytes (an earlier run?); receiving again", ann.version, stale)
            shutil.rmtree(stale)
            return receive(self.bus, ann, str(self.dest_root), RECEIVE_TIMEOUT_S, cancelled,
                           keep=self.cfg.actor.weights_keep)

    async def _fetch(self, ann: WeightAnnouncement):
        """Receive and verify the version; returns the coroutine function that swaps it in."""
        loop = asyncio.get_running_loop()
        if ann.layout == "buckets":
            key = await self._stage(ann)
            return lambda: self.policy.swap_staged(key, len(ann.buckets), ann.version)
        folder = await loop.run_in_executor(self.executor, self._receive, ann)
        return lambda: self.policy.swap_weights(str(folder), ann.version)

    async def _stage(self, ann: WeightAnnouncement) -> str:
        """In-memory version: each verified bucket goes straight to the engine's staging (no file); a version
        that fails part-way is dropped there, and the engine never saw any of it."""
        from cluster.weights.buckets import HeldBuckets, receive_pipelined
        from cluster.weights.transport import WeightsCorrupt

        if not hasattr(self.policy, "stage_bucket"):
            raise WeightsCorrupt(f"weights v{ann.version}: this policy cannot load an in-memory version")
        loop, stop = asyncio.get_running_loop(), self._stop
        key = f"{ann.model_name}:{ann.version}:{ann.sha256[:16]}"

        def submit(i: int, data: bytes):  # staged while the next bucket arrives
            return asyncio.run_coroutine_threadsafe(self.policy.stage_bucket(key, i, data), loop)

        cancelled = (lambda: stop.is_set()) if stop is not None else None
        if not ann.delta_codec:
            self.held = None
        elif self.held is None:
            self.held = HeldBuckets()
        held = self.held
        try:
            await loop.run_in_executor(self.executor, lambda: receive_pipelined(
                self.bus, ann, submit, RECEIVE_TIMEOUT_S, cancelled, held))
        except BaseException:
            await self.policy.drop_staged(key)
            raise
        return key

    async def apply(self, rec: Any) -> bool:
        """Receive, verify and swap in the announced version of ``rec``; False if it is not applied."""
        ann = rec.msg
        loop = asyncio.get_running_loop()
        try:
            swap = await self._fetch(ann)
        except Exception as exc:  # noqa: BLE001 - a bad version is skipped; the old weights keep serving
            why = self._failed(ann, exc)
            if why:
                await loop.run_in_executor(self.executor, self._letter, rec, why)
            return False
        ms = await swap()
        self.gate.mark_applied(ann.version)
        self.pending = {v: a for v, a in self.pending.items() if v > ann.version}
        self.applied.append({"version": ann.version, "swap_ms": ms})
        self.learner_steps = max(self.learner_steps, int(ann.step))
        metrics.inc("weight_versions_applied")
        metrics.set_gauge("weight_version", ann.version)
        metrics.observe("swap_ms", ms)
        return True

    def _failed(self, ann: WeightAnnouncement, exc: Exception) -> str:
        """Keep a version for another attempt while a retry can help; otherwise give it up and return why."""
        n = self.attempts[ann.version] = self.attempts.get(ann.version, 0) + 1
        again = is_retriable(exc) and n < RECEIVE_ATTEMPTS and not (self._stop and self._stop.is_set())
        msg = (f"weights v{ann.version}: not applied (attempt {n}/{RECEIVE_ATTEMPTS}"
               f"{', will retry' if again else ', given up'}): {type(exc).__name__}: {exc}")
        log.error(msg)
        self.errors.append(msg)
        if again:
            self.retry_at[ann.version] = time.monotonic() + min(2.0 ** n, 30.0)
            return ""
        self.pending.pop(ann.version, None)
        metrics.inc("weight_versions_given_up")
        return msg

    def _letter(self, rec: Any, why: str) -> None:
        """A version given up is dead-lettered (by each actor that gave it up), unless the role is stopping."""
        from cluster.bus.serve import dead_letter_record

        if self._stop is not None and self._stop.is_set():
            return
        try:
            dead_letter_record(self.bus, rec, why)
        except Exception as exc:  # noqa: BLE001 - the error list and the log still say why
            log.error("could not dead-letter weights v%d: %s", rec.msg.version, exc)
