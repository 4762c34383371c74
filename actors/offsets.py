"""Which task offset may be committed, when episodes finish out of order.

Kafka commits a position per partition: committing offset o says every record
before it is done. With C concurrent episodes the first task may finish last,
so a record is committed only once it and every earlier delivered record of
its partition are done (their trajectories published).
"""
from __future__ import annotations

from typing import Any


class OffsetTracker:
    def __init__(self) -> None:
        self._parts: dict[tuple[str, int], dict[int, tuple[Any, bool]]] = {}

    def delivered(self, rec: Any) -> None:
        self._parts.setdefault((rec.topic, rec.partition), {})[rec.offset] = (rec, False)

    def done(self, rec: Any) -> Any | None:
        """Mark ``rec`` finished; return the record to commit through (or None: an earlier one still runs)."""
        part = self._parts.get((rec.topic, rec.partition))
        if part is None or rec.offset not in part:
            return None
        part[rec.offset] = (rec, True)
        commit = None
        for off in sorted(part):
            r, finished = part[off]
            if not finished:
                break
            commit = r
            del part[off]
        return commit

    def forget_partition(self, topic: str, partition: int) -> None:
        self._parts.pop((topic, partition), None)

    def pending(self) -> int:
        return sum(len(p) for p in self._parts.values())
