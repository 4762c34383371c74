"""Reading a topic as a log: bounded scans by offset or record time, committed offsets.

Used by replay, the run report and the chaos checks. Scans use manually assigned
partitions and no consumer group, so they never disturb the roles' groups.
"""
from __future__ import annotations

import logging
from typing import Iterator

from cluster.bus.client import Received

log = logging.getLogger(__name__)


def _partitions(bus, kc, topic: str):
    from kafka import TopicPartition

    full = bus.topic(topic)
    parts = kc.partitions_for_topic(full) or set()
    return [TopicPartition(full, p) for p in sorted(parts)]


def _scanner(bus, topic: str):
    cons = bus.consumer([], None, assign=[], dlq=False, enable_auto_commit=False)
    kc = cons.kafka
    tps = _partitions(bus, kc, topic)
    kc.assign(tps)
    return cons, kc, tps


def offsets_at(bus, topic: str, timestamp_ms: int) -> dict[int, int]:
    """First offset per partition whose record time is >= timestamp_ms (end if none)."""
    cons, kc, tps = _scanner(bus, topic)
    try:
        found = kc.offsets_for_times({tp: int(timestamp_ms) for tp in tps}) if tps else {}
        ends = kc.end_offsets(tps) if tps else {}
        return {tp.partition: (found[tp].offset if found.get(tp) is not None else ends[tp]) for tp in tps}
    finally:
        cons.close()


def bounds(bus, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """(beginning offsets, end offsets) per partition."""
    cons, kc, tps = _scanner(bus, topic)
    try:
        if not tps:
            return {}, {}
        begin, end = kc.beginning_offsets(tps), kc.end_offsets(tps)
        return {tp.partition: begin[tp] for tp in tps}, {tp.partition: end[tp] for tp in tps}
    finally:
        cons.close()


def read_topic(bus, topic: str, start: dict[int, int] | None = None, end: dict[int, int] | None = None,
               raw: bool = False) -> Iterator[Received]:
    """Yield every record of ``topic`` with start[p] <= offset < end[p] (default: all of it).

    Undecodable records come back with ``msg=None`` (a scan reports, it does not dead-letter)
    unless ``raw``, which yields the undecoded bytes as ``msg``.
    """
    from schemas import codec

    cons, kc, tps = _scanner(bus, topic)
    try:
        if not tps:
            return
        begin, ends = kc.beginning_offsets(tps), kc.end_offsets(tps)
        todo = {}
        for tp in tps:
            lo = max(begin[tp], (start or {}).get(tp.partition, begin[tp]))
            hi = min(ends[tp], (end or {}).get(tp.partition, ends[tp]))
            if lo < hi:
                kc.seek(tp, lo)
                todo[tp] = hi
            else:
                kc.pause(tp)
        idle = 0
        while todo and idle < 200:
            batches = kc.poll(timeout_ms=200)
            idle = 0 if batches else idle + 1
            for tp, records in batches.items():
                hi = todo.get(tp)
                for r in records:
                    if hi is None or r.offset >= hi:
                        break
                    yield _received(bus, tp, r, codec, raw)
                if hi is not None and kc.position(tp) >= hi:
                    del todo[tp]
                    kc.pause(tp)
        if todo:
            log.warning("scan of %s stopped early: partitions %s gave no data", topic, [tp.partition for tp in todo])
    finally:
        cons.close()


def _received(bus, tp, r, codec, raw: bool) -> Received:
    msg = r.value
    if not raw:
        try:
            msg = codec.decode(r.value)
        except codec.SchemaError:
            msg = None
    key = r.key.decode(errors="replace") if r.key is not None else None
    return Received(msg=msg, topic=bus.logical(tp.topic), partition=tp.partition, offset=r.offset,
                    key=key, timestamp_ms=r.timestamp, raw_topic=tp.topic)


def committed_offsets(bus, group_id: str, topic: str) -> dict[int, int]:
    """The group's committed next-offset per partition (0 where nothing is committed)."""
    from kafka import KafkaAdminClient

    from cluster.bus.clients import admin_kwargs
    from cluster.errors import retry

    cons, kc, tps = _scanner(bus, topic)
    cons.close()
    admin = KafkaAdminClient(**admin_kwargs(bus.cfg, f"{bus.client_id}-offsets", bus.bootstrap))
    try:
        # a fresh broker has no group coordinator for a moment (CoordinatorNotAvailable is retriable)
        got = retry(lambda: admin.list_group_offsets({group_id: tps}).get(group_id, {}),
                    f"offsets of group {group_id}") if tps else {}
        out = {}
        for tp in tps:
            c = got.get(tp)
            out[tp.partition] = c.offset if c is not None and c.offset is not None and c.offset >= 0 else 0
        return out
    finally:
        admin.close()
