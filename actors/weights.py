"""Follow the weights topic and hot-swap each newer, verified policy version into the engine.

Every actor reads all announcements (its own consumer group, from the start),
so a fresh actor catches up to the newest version at once. A version is applied
only after ``cluster.weights_transport.receive`` has assembled and checked it;
a corrupt or missing version is skipped with an error and the old weights keep
serving. Episodes waiting on tools are untouched: the swap only pauses the
engine, which keeps its in-flight requests.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from cluster.errors import RetriableError
from schemas import topics as T
from schemas.messages import WeightAnnouncement

from cluster import metrics

log = logging.getLogger(__name__)


class WeightFollower:
    def __init__(self, bus: Any, cfg: Any, policy: Any, actor_id: str, dest_root: Path,
                 executor: Any = None):
        from cluster.weights_transport import VersionGate

        self.bus, self.cfg, self.policy, self.actor_id = bus, cfg, policy, actor_id
        self.dest_root = Path(dest_root)
        self.gate = VersionGate(applied=policy.version)
        self.newest_announced = policy.version
        self.model_name = cfg.learner.model_name
        self.executor = executor
        self.errors: list[str] = []
        self.applied: list[dict] = []

    @property
    def lag(self) -> int:
        return max(0, self.newest_announced - self.policy.version)

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
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
                newest = None
                for rec in recs:
                    ann = rec.msg
                    if ann.model_name != self.model_name:
                        continue
                    self.newest_announced = max(self.newest_announced, ann.version)
                    if self.gate.wants(ann) and (newest is None or ann.version > newest.version):
                        newest = ann
                if newest is not None:
                    await self.apply(newest)
                if recs:
                    await loop.run_in_executor(self.executor, cons.commit)
        finally:
            await loop.run_in_executor(self.executor, cons.close)

    def _receive(self, ann: WeightAnnouncement):
        """Assemble + verify; a stale folder of the same version (an earlier run's) is replaced once."""
        import shutil

        from cluster.weights_transport import WeightsCorrupt, receive, version_dir

        try:
            return receive(self.bus, ann, str(self.dest_root), 300.0)
        except WeightsCorrupt:
            stale = version_dir(self.dest_root, ann.model_name, ann.version)
            if ann.transport == "fs" or not stale.exists():  # fs folders are the source itself
                raise
            log.warning("weights v%d: %s holds other bytes (an earlier run?); receiving again", ann.version, stale)
            shutil.rmtree(stale)
            return receive(self.bus, ann, str(self.dest_root), 300.0)

    async def apply(self, ann: WeightAnnouncement) -> bool:

        loop = asyncio.get_running_loop()
        try:
            folder = await loop.run_in_executor(self.executor, self._receive, ann)
        except Exception as exc:  # noqa: BLE001 - a bad version is skipped; the old weights keep serving
            msg = f"weights v{ann.version}: not applied: {type(exc).__name__}: {exc}"
            log.error(msg)
            self.errors.append(msg)
            return False
        ms = await self.policy.swap_weights(str(folder), ann.version)
        self.gate.mark_applied(ann.version)
        self.applied.append({"version": ann.version, "swap_ms": ms})
        metrics.inc("weight_versions_applied")
        metrics.set_gauge("weight_version", ann.version)
        metrics.observe("swap_ms", ms)
        return True
