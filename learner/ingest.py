"""Trajectory ingestion: dedupe, staleness bound, stage filters, and exactly-once positions.

``Ingest`` buffers records in consumption order. ``take(n, version)`` returns
the next n trainable samples and advances the per-partition positions over
exactly the records it looked at (trained or dropped), so the positions saved in
a checkpoint say precisely which records the checkpointed model has seen; the
records still buffered are read again after a restart. Episode ids already
trained (kept in the checkpoint too) are dropped as duplicates. Trajectories
whose reward the infrastructure kept from being measured (reward_status
"undetermined") are skipped like any other dropped record and counted under
``dropped["undetermined"]`` (`skipped_undetermined`).
"""
from __future__ import annotations

import logging
from collections import Counter, OrderedDict, deque

from learner.data import InvalidTrajectory, Sample, from_trajectory, stage_rejects
from schemas.messages import REWARD_UNDETERMINED

log = logging.getLogger(__name__)


UNDETERMINED = "undetermined"  # the dropped-reason of trajectories whose reward could not be determined


class SeenIds:
    """Bounded insertion-ordered set of episode ids (oldest forgotten first)."""

    def __init__(self, limit: int = 200_000, ids: list[str] | None = None) -> None:
        self.limit = limit
        self._d: OrderedDict[str, None] = OrderedDict((i, None) for i in (ids or []))

    def __contains__(self, eid: str) -> bool:
        return eid in self._d

    def add(self, eid: str) -> None:
        self._d[eid] = None
        while len(self._d) > self.limit:
            self._d.popitem(last=False)

    def to_list(self) -> list[str]:
        return list(self._d)


class Ingest:
    def __init__(self, stage: str, max_staleness: int, positions: dict[int, int] | None = None,
                 seen: list[str] | None = None, seen_limit: int = 200_000, vocab_size: int = 0) -> None:
        self.stage = stage
        self.vocab_size = vocab_size  # token ids at or above it are invalid (0 = not checked)
        self.rejected: list[tuple[int, int, str]] = []  # (partition, offset, why) of invalid records, to dead-letter
        self.max_staleness = max_staleness
        self.positions: dict[int, int] = dict(positions or {})  # partition -> next offset to read
        self.seen = SeenIds(seen_limit, seen)
        self._buf: deque[tuple[int, int, Sample | None, str]] = deque()
        self._pending_ids: set[str] = set()
        self.dropped: Counter[str] = Counter()
        self.staleness: Counter[int] = Counter()
        self.last_dropped_stale: list[str] = []

    def offer(self, msg, partition: int, offset: int) -> None:
        """Buffer one consumed record (msg None = undecodable; it still occupies its offset)."""
        if offset < self.positions.get(partition, 0):
            return  # already covered by the checkpoint (a redelivery after seek)
        reason, sample = "", None
        if msg is None:
            reason = "undecodable"
        elif getattr(msg, "reward_status", "") == REWARD_UNDETERMINED:
            reason = UNDETERMINED  # no reward to learn from: not the policy's -1, not a 0
        else:
            try:
                sample = from_trajectory(msg, partition, offset, self.vocab_size)
            except InvalidTrajectory as exc:
                log.warning("dropping invalid trajectory at %d:%d: %s", partition, offset, exc)
                reason = "invalid"
                self.rejected.append((partition, offset, str(exc)))
        if sample is not None:
            if sample.episode_id in self.seen or sample.episode_id in self._pending_ids:
                reason, sample = "duplicate", None
            else:
                reason = stage_rejects(sample, self.stage)
                self._pending_ids.add(sample.episode_id)
        # A sample the current stage rejects stays buffered with its reason: a stage switch may accept it.
        self._buf.append((partition, offset, sample, reason))

    def set_stage(self, stage: str) -> None:
        """Switch stage filters; buffered, not yet consumed samples are judged again by the new stage."""
        self.stage = stage
        buf = deque()
        for part, off, sample, reason in self._buf:
            if sample is not None:
                reason = stage_rejects(sample, stage)
            buf.append((part, off, sample, reason))
        self._buf = buf

    def ready(self) -> int:
        """How many buffered samples may be trainable (before the staleness check at take time)."""
        return sum(1 for _, _, s, reason in self._buf if s is not None and not reason)

    def take(self, n: int, policy_version: int) -> list[Sample]:
        """Pop up to n trainable samples; every record passed over is accounted and its offset consumed."""
        out: list[Sample] = []
        while self._buf and len(out) < n:
            part, off, sample, reason = self._buf.popleft()
            if sample is not None:
                self._pending_ids.discard(sample.episode_id)
                self.seen.add(sample.episode_id)
            if sample is not None and not reason:
                lag = policy_version - sample.min_version
                # RFT is supervised on filtered samples: the behaviour policy is not in its loss, so old
                # samples (demonstrations included) are not stale there.
                if lag > self.max_staleness and self.stage != "rft":
                    reason = "stale"
                    self.last_dropped_stale.append(sample.episode_id)
                else:
                    self.staleness[max(lag, 0)] += 1
                    out.append(sample)
            if reason:
                self.dropped[reason] += 1
            self.positions[part] = max(self.positions.get(part, 0), off + 1)
        # Records dropped right behind the last taken sample are consumed too (nothing to wait for).
        while self._buf and self._buf[0][3]:
            part, off, sample, reason = self._buf.popleft()
            if sample is not None:
                self._pending_ids.discard(sample.episode_id)
                self.seen.add(sample.episode_id)
            self.dropped[reason] += 1
            self.positions[part] = max(self.positions.get(part, 0), off + 1)
        return out

    @property
    def skipped_undetermined(self) -> int:
        """Trajectories skipped (offsets consumed) because their reward was undetermined."""
        return self.dropped.get(UNDETERMINED, 0)

    def drain_stale(self) -> list[str]:
        """Episode ids dropped as stale since the last call (for the learner's step log)."""
        out, self.last_dropped_stale = self.last_dropped_stale, []
        return out

    def state(self) -> dict:
        return {"positions": {str(k): v for k, v in self.positions.items()}, "seen": self.seen.to_list(),
                "dropped": dict(self.dropped), "staleness": {str(k): v for k, v in self.staleness.items()}}

    @classmethod
    def from_state(cls, stage: str, max_staleness: int, state: dict | None) -> "Ingest":
        state = state or {}
        ing = cls(stage, max_staleness, {int(k): int(v) for k, v in state.get("positions", {}).items()},
                  state.get("seen", []))
        ing.dropped.update(state.get("dropped", {}))
        ing.staleness.update({int(k): v for k, v in state.get("staleness", {}).items()})
        return ing
