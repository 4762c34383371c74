"""Replay: select records of a topic by offset or record-time range and by trajectory
fields, and send them to another topic or to files.

Time ranges use Kafka's record timestamps (``offsets_for_times``), so "what was
produced between 10:00 and 10:05" is answered by the broker's index, not by
decoding everything.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from cluster.bus.scan import bounds, offsets_at, read_topic
from cluster.errors import InputError
from schemas import codec

log = logging.getLogger(__name__)


class ReplayError(InputError):
    """A replay request that cannot be served as given (exit 2, one line)."""


_REL = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")


def parse_time(text: str, now: float | None = None) -> int:
    """Unix ms from '1733150000000', '2026-12-02T10:00:00' (UTC if naive) or '-15m' (relative)."""
    text = text.strip()
    if text.isdigit():
        return int(text) if len(text) >= 12 else int(text) * 1000
    m = _REL.match(text)
    if m:
        scale = {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        return int(((now or time.time()) - float(m.group(1)) * scale) * 1000)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ReplayError(f"time {text!r}: use unix ms, ISO 8601 (e.g. 2026-12-02T10:00:00Z) or -15m") from None
    if dt.tzinfo is None:
        from datetime import timezone

        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def parse_offsets(items: list[str] | None) -> dict[int, int] | int | None:
    """'N' (every partition) or one or more 'P:N'."""
    if not items:
        return None
    if len(items) == 1 and ":" not in items[0]:
        return _int(items[0], items[0])
    out = {}
    for item in items:
        p, sep, n = item.partition(":")
        if not sep:
            raise ReplayError(f"offset {item!r}: mix of plain and partition:offset forms")
        out[_int(p, item)] = _int(n, item)
    return out


def _int(text: str, item: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ReplayError(f"offset {item!r}: use N (every partition) or P:N, with whole numbers") from None
    if value < 0:
        raise ReplayError(f"offset {item!r}: offsets and partitions are >= 0")
    return value


@dataclasses.dataclass
class Selection:
    topic: str = "trajectories"
    from_offset: dict[int, int] | int | None = None
    to_offset: dict[int, int] | int | None = None  # exclusive
    since_ms: int | None = None
    until_ms: int | None = None  # exclusive
    task_ids: tuple[str, ...] = ()
    min_reward: float | None = None
    max_reward: float | None = None
    min_version: int | None = None
    max_version: int | None = None

    def keep(self, msg: Any) -> bool:
        if self.task_ids and getattr(msg, "task_id", None) not in self.task_ids:
            return False
        reward = getattr(msg, "reward", None)
        if reward is not None:
            if self.min_reward is not None and reward < self.min_reward:
                return False
            if self.max_reward is not None and reward > self.max_reward:
                return False
        versions = getattr(msg, "policy_version", None)
        if versions is not None and (self.min_version is not None or self.max_version is not None):
            gen = versions[versions >= 0]
            if gen.size == 0:
                return False
            if self.min_version is not None and int(gen.min()) < self.min_version:
                return False
            if self.max_version is not None and int(gen.max()) > self.max_version:
                return False
        return True


def _expand(value, parts: dict[int, int]) -> dict[int, int] | None:
    if value is None:
        return None
    if isinstance(value, int):
        return {p: value for p in parts}
    return value


def resolve_range(bus, sel: Selection) -> tuple[dict[int, int], dict[int, int]]:
    """Per-partition [start, end) offsets for the selection."""
    begin, end = bounds(bus, sel.topic)
    if not begin:
        raise ReplayError(f"topic {bus.topic(sel.topic)!r} does not exist or has no partitions")
    lo, hi = dict(begin), dict(end)
    for bound, target, pick in ((_expand(sel.from_offset, begin), lo, max), (_expand(sel.to_offset, begin), hi, min)):
        for p, v in (bound or {}).items():
            if p not in target:
                raise ReplayError(f"partition {p} not in {bus.topic(sel.topic)!r} (has {sorted(begin)})")
            target[p] = pick(target[p], v)
    if sel.since_ms is not None:
        for p, v in offsets_at(bus, sel.topic, sel.since_ms).items():
            lo[p] = max(lo[p], v)
    if sel.until_ms is not None:
        for p, v in offsets_at(bus, sel.topic, sel.until_ms).items():
            hi[p] = min(hi[p], v)
    return lo, hi


class DirSink:
    """One msgpack file per record plus index.jsonl (offset, time, ids, reward)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index = open(self.folder / "index.jsonl", "a")  # noqa: SIM115 - closed in close()

    def write(self, rec, payload: bytes) -> None:
        name = f"{rec.partition:03d}-{rec.offset:012d}.msgpack"
        (self.folder / name).write_bytes(payload)
        m = rec.msg
        self.index.write(json.dumps({"file": name, "partition": rec.partition, "offset": rec.offset,
                                     "timestamp_ms": rec.timestamp_ms, "kind": getattr(m, "KIND", ""),
                                     "episode_id": getattr(m, "episode_id", ""), "task_id": getattr(m, "task_id", ""),
                                     "reward": getattr(m, "reward", None)}) + "\n")

    def close(self) -> None:
        self.index.close()


class TopicSink:
    def __init__(self, bus, topic: str):
        self.producer, self.topic = bus.producer(), topic

    def write(self, rec, payload: bytes) -> None:
        self.producer.send_bytes(self.topic, payload, key=rec.key)

    def close(self) -> None:
        self.producer.flush()
        self.producer.close()


def replay(bus, sel: Selection, sink, progress: bool = True) -> dict:
    """Copy the selected records to ``sink``; returns counts and the ranges used."""
    lo, hi = resolve_range(bus, sel)
    total = sum(max(0, hi[p] - lo[p]) for p in lo)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="msg", desc=f"replay {sel.topic}", leave=False)
    scanned = copied = undecodable = 0
    try:
        for rec in read_topic(bus, sel.topic, lo, hi, raw=True):
            scanned += 1
            if bar:
                bar.update(1)
            try:
                rec.msg, payload = codec.decode(rec.msg), rec.msg
            except codec.SchemaError:
                undecodable += 1
                continue
            if sel.keep(rec.msg):
                sink.write(rec, payload)
                copied += 1
    finally:
        if bar:
            bar.close()
        sink.close()
    return {"scanned": scanned, "copied": copied, "undecodable": undecodable,
            "ranges": {str(p): [lo[p], hi[p]] for p in sorted(lo)}}
