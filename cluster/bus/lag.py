"""Consumer-group lag per topic (end offset minus committed offset), for dashboards and stress."""
from __future__ import annotations

from typing import Iterable


def group_lag(bus, group_id: str, topics: Iterable[str]) -> dict[str, int]:
    """{logical topic: messages not yet committed by ``group_id``} (uncommitted partitions count fully)."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin import OffsetSpec

    from cluster.bus.clients import admin_kwargs

    admin = KafkaAdminClient(**admin_kwargs(bus.cfg, f"{bus.client_id}-lag", bus.bootstrap))
    try:
        names = [bus.topic(t) for t in topics]
        meta = admin.describe_topics(names)
        tps = [TopicPartition(t["name"], p["partition_index"]) for t in meta for p in t["partitions"]]
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in tps}) if tps else {}
        committed = admin.list_group_offsets({group_id: tps}).get(group_id, {}) if tps else {}
        out = {bus.logical(n): 0 for n in names}
        for tp in tps:
            c = committed.get(tp)
            done = c.offset if c is not None and c.offset is not None and c.offset >= 0 else 0
            out[bus.logical(tp.topic)] += max(0, ends[tp].offset - done)
        return out
    finally:
        admin.close()
