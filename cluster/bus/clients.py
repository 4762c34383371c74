"""kafka-python client settings derived from the config: connection, security, tuning.

One place turns ``cfg.bus`` into keyword arguments for KafkaProducer, KafkaConsumer
and KafkaAdminClient, so every role connects the same way (SASL/TLS included). With
``broker.auth = "sasl"`` and ``bus.security_protocol`` left at PLAINTEXT, clients use SASL_PLAINTEXT +
PLAIN: the embedded broker's authenticated listener.
"""
from __future__ import annotations

from cluster.broker import state as broker_state

_FETCH_SLACK = 1024 * 1024  # room for record batch headers above the largest message


def connection_kwargs(cfg, client_id: str, bootstrap: str | None = None) -> dict:
    """bootstrap + client id + security settings (passed through to kafka-python)."""
    bus = cfg.bus
    protocol, mechanism = bus.security_protocol, bus.sasl_mechanism
    if cfg.broker.auth == "sasl" and protocol == "PLAINTEXT":  # the embedded broker's authenticated listener
        protocol, mechanism = "SASL_PLAINTEXT", mechanism or "PLAIN"
    kw: dict = {
        "bootstrap_servers": (bootstrap or broker_state.bootstrap_servers(cfg)).split(","),
        "client_id": client_id,
        "security_protocol": protocol,
        "reconnect_backoff_max_ms": bus.reconnect_backoff_max_ms,
    }
    if mechanism:
        kw["sasl_mechanism"] = mechanism
        if bus.sasl_username:
            kw["sasl_plain_username"] = bus.sasl_username
            kw["sasl_plain_password"] = bus.sasl_password
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if getattr(bus, name):
            kw[name] = getattr(bus, name)
    return kw


def producer_kwargs(cfg, client_id: str, bootstrap: str | None = None, **overrides) -> dict:
    bus = cfg.bus
    kw = connection_kwargs(cfg, client_id, bootstrap)
    kw.update(
        acks="all",
        enable_idempotence=True,
        compression_type=None if bus.compression == "none" else bus.compression,
        linger_ms=bus.linger_ms,
        max_request_size=bus.max_message_bytes + _FETCH_SLACK,
        request_timeout_ms=30000,
        delivery_timeout_ms=int(bus.delivery_timeout_s * 1000),
        max_block_ms=30000,
        retry_backoff_ms=100,
        allow_auto_create_topics=False,
    )
    kw.update(overrides)
    return kw


def consumer_kwargs(cfg, client_id: str, group_id: str | None, bootstrap: str | None = None,
                    **overrides) -> dict:
    bus = cfg.bus
    kw = connection_kwargs(cfg, client_id, bootstrap)
    per_partition = bus.max_message_bytes + _FETCH_SLACK
    kw.update(
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset=bus.auto_offset_reset,
        fetch_max_wait_ms=bus.fetch_max_wait_ms,
        fetch_min_bytes=1,
        max_partition_fetch_bytes=per_partition,
        fetch_max_bytes=max(52428800, 2 * per_partition),
        max_poll_records=bus.max_poll_records,
        max_poll_interval_ms=bus.max_poll_interval_ms,
        session_timeout_ms=bus.session_timeout_ms,
        heartbeat_interval_ms=bus.heartbeat_interval_ms,
        allow_auto_create_topics=False,
        request_timeout_ms=max(30000, bus.session_timeout_ms + 5000),
    )
    kw.update(overrides)
    return kw


def admin_kwargs(cfg, client_id: str, bootstrap: str | None = None) -> dict:
    kw = connection_kwargs(cfg, client_id, bootstrap)
    kw["request_timeout_ms"] = 30000
    return kw
