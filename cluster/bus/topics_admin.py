"""Create and describe kernelrl's topics (DESIGN.md) with limits from ``cfg.topics``.

Creation is idempotent: existing topics are left alone (and reported), missing ones
are created with their partitions, retention, compression and message-size limits.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from schemas import topics as T

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSpec:
    logical: str
    partitions: int
    configs: dict


def specs(cfg) -> list[TopicSpec]:
    """What every logical topic of schemas.topics.ALL should look like."""
    t = cfg.topics
    base_max = cfg.bus.max_message_bytes + 1024 * 1024

    def conf(retention: int, max_bytes: int = base_max) -> dict:
        # with 3 replicas an acks=all write needs 2 in sync: one broker may die without losing an acked record
        return {"retention.ms": str(retention), "max.message.bytes": str(max_bytes),
                "compression.type": t.compression, "cleanup.policy": "delete",
                "min.insync.replicas": "2" if t.replication_factor >= 3 else "1"}

    out = {
        T.TASKS: TopicSpec(T.TASKS, t.partitions, conf(t.retention_ms)),
        T.TOOL_COMPILE: TopicSpec(T.TOOL_COMPILE, t.tool_partitions, conf(t.retention_ms)),
        T.TOOL_REPLIES: TopicSpec(T.TOOL_REPLIES, t.reply_partitions, conf(t.retention_ms)),
        T.TRAJECTORIES: TopicSpec(T.TRAJECTORIES, t.partitions,
                                  conf(t.trajectory_retention_ms, t.trajectory_max_message_bytes + 1024 * 1024)),
        # announcements must stay in order: one partition
        T.WEIGHTS: TopicSpec(T.WEIGHTS, 1, conf(t.retention_ms)),
        T.WEIGHTS_CHUNKS: TopicSpec(T.WEIGHTS_CHUNKS, 1,
                                    conf(t.retention_ms, t.weights_max_message_bytes + 1024 * 1024)),
        T.DLQ: TopicSpec(T.DLQ, 1, conf(t.dlq_retention_ms)),
    }
    for name in T.ALL:
        if name not in out:  # the per-device evaluate topics and anything added later
            out[name] = TopicSpec(name, t.tool_partitions, conf(t.retention_ms))
    return [out[name] for name in T.ALL]


def _admin(cfg, bootstrap: str | None = None):
    from kafka import KafkaAdminClient

    from cluster.bus.clients import admin_kwargs

    return KafkaAdminClient(**admin_kwargs(cfg, f"{cfg.bus.client_id}-admin", bootstrap))


def create_all(cfg, bootstrap: str | None = None, wait: bool = True) -> dict[str, str]:
    """Create the missing topics; returns {full name: 'created' | 'exists'}."""
    from kafka.errors import TopicAlreadyExistsError

    admin = _admin(cfg, bootstrap)
    try:
        existing = set(admin.list_topics())
        wanted = {cfg.topic(s.logical): s for s in specs(cfg)}
        missing = {name: {"num_partitions": s.partitions,
                          "replication_factor": cfg.topics.replication_factor,
                          "configs": s.configs}
                   for name, s in wanted.items() if name not in existing}
        result = {name: "exists" for name in wanted if name in existing}
        if missing:
            resp = admin.create_topics(missing, timeout_ms=30000, raise_errors=False)
            for topic in resp["topics"]:
                code = topic.get("error_code", 0)
                if code and code != TopicAlreadyExistsError.errno:
                    raise RuntimeError(f"creating topic {topic['name']}: error {code} "
                                       f"{topic.get('error_message')}")
                result[topic["name"]] = "created" if not code else "exists"
            if wait:
                admin.wait_for_topics(list(missing), timeout_ms=30000)
        log.info("topics: %s", result)
        return result
    finally:
        admin.close()


def describe(cfg, bootstrap: str | None = None) -> list[dict]:
    """Partitions, configs and end offsets of every kernelrl topic (missing ones flagged)."""
    from kafka import TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, OffsetSpec

    admin = _admin(cfg, bootstrap)
    try:
        names = [cfg.topic(s.logical) for s in specs(cfg)]
        existing = set(admin.list_topics())
        present = [n for n in names if n in existing]
        meta = {t["name"]: t for t in admin.describe_topics(present)} if present else {}
        configs = {}
        if present:
            res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in present],
                                         config_filter="all")
            configs = res.get("topic", {})
        tps = [TopicPartition(n, p["partition_index"]) for n in present for p in meta[n]["partitions"]]
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in tps}) if tps else {}
        out = []
        for name in names:
            if name not in existing:
                out.append({"name": name, "exists": False})
                continue
            conf = configs.get(name, {})
            keep = ("retention.ms", "max.message.bytes", "compression.type", "cleanup.policy")
            out.append({
                "name": name, "exists": True, "partitions": len(meta[name]["partitions"]),
                "configs": {k: _config_value(conf.get(k)) for k in keep},
                "messages": sum(ends[tp].offset for tp in tps if tp.topic == name),
            })
        return out
    finally:
        admin.close()


def _config_value(entry) -> str | None:
    if entry is None:
        return None
    if isinstance(entry, dict):
        return entry.get("value", entry.get("config_value"))
    return str(entry)


def delete_prefix(cfg, bootstrap: str | None = None) -> list[str]:
    """Delete every topic under cfg.bus.topic_prefix (tests clean up with this)."""
    admin = _admin(cfg, bootstrap)
    try:
        names = [n for n in admin.list_topics() if n.startswith(cfg.bus.topic_prefix)]
        if names:
            admin.delete_topics(names, timeout_ms=30000, raise_errors=False)
        return names
    finally:
        admin.close()


def create_copy(cfg, source: str, dest: str, bootstrap: str | None = None) -> str:
    """Create topic ``dest`` (full name) like ``source`` (partitions, retention, limits)
    unless it exists; used by replay. Returns 'created' or 'exists'."""
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import TopicAlreadyExistsError

    admin = _admin(cfg, bootstrap)
    try:
        if dest in set(admin.list_topics()):
            return "exists"
        meta = admin.describe_topics([source])
        if not meta or not meta[0].get("partitions"):
            raise RuntimeError(f"source topic {source!r} does not exist")
        keep = ("retention.ms", "max.message.bytes", "compression.type", "cleanup.policy")
        res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, source)], config_filter="all")
        conf = res.get("topic", {}).get(source, {})
        configs = {k: _config_value(conf.get(k)) for k in keep if _config_value(conf.get(k)) is not None}
        resp = admin.create_topics({dest: {"num_partitions": len(meta[0]["partitions"]),
                                           "replication_factor": cfg.topics.replication_factor,
                                           "configs": configs}}, timeout_ms=30000, raise_errors=False)
        code = resp["topics"][0].get("error_code", 0)
        if code and code != TopicAlreadyExistsError.errno:
            raise RuntimeError(f"creating topic {dest}: error {code} {resp['topics'][0].get('error_message')}")
        admin.wait_for_topics([dest], timeout_ms=30000)
        return "created"
    finally:
        admin.close()
