"""`kernelrl bench bus`: request/reply RTT through our bus vs plain kafka-python, and codec speed.

All numbers come from the same run on the same broker: ``raw_*`` is a ping-pong of
plain kafka-python producers/consumers through two topics (library defaults, manual
assignment), ``rtt_*`` is RequestClient -> serve() with a null handler -> reply.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time

import numpy as np

log = logging.getLogger(__name__)


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def big_trajectory(tokens: int = 131072):
    from schemas.messages import Trajectory, TurnInfo

    rng = np.random.default_rng(0)
    turns = [TurnInfo(start=i * 1000, gen_start=i * 1000 + 200, gen_end=i * 1000 + 900, tool_name="compile",
                      tool_latency_s=1.5) for i in range(tokens // 1000)]
    return Trajectory(episode_id="ep-bench", task_id="task-bench", actor_id="actor-0",
                      token_ids=rng.integers(0, 150000, tokens, dtype=np.int32),
                      logprobs=rng.standard_normal(tokens).astype(np.float32),
                      loss_mask=np.ones(tokens, np.uint8), policy_version=np.zeros(tokens, np.int32),
                      prompt_len=512, turns=turns, reward=2.0, evidence={"correct": True, "speedup": 1.3},
                      end_reason="finish")


def bench_codec(n: int = 30) -> float:
    """Median ms of encode + decode of a 131,072-token trajectory."""
    from schemas import codec

    traj = big_trajectory()
    for _ in range(3):
        codec.decode(codec.encode(traj))
    times = []
    for _ in range(n):
        t = time.perf_counter()
        codec.decode(codec.encode(traj))
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def bench_raw(cfg, bootstrap: str, n: int, warmup: int) -> list[float]:
    """Plain kafka-python ping-pong through two single-partition topics."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

    stamp = f"{int(time.time() * 1000)}"
    ping, pong = f"{cfg.bus.topic_prefix}bench.ping.{stamp}", f"{cfg.bus.topic_prefix}bench.pong.{stamp}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics({ping: {"num_partitions": 1, "replication_factor": 1},
                         pong: {"num_partitions": 1, "replication_factor": 1}}, wait_for_metadata=True)
    stop, ready = threading.Event(), threading.Event()

    def ponger():
        c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        c.assign([TopicPartition(ping, 0)])
        c.position(TopicPartition(ping, 0))
        p = KafkaProducer(bootstrap_servers=bootstrap)
        ready.set()
        while not stop.is_set():
            for recs in c.poll(timeout_ms=100).values():
                for r in recs:
                    p.send(pong, r.value)
        c.close()
        p.close()

    th = threading.Thread(target=ponger, daemon=True)
    th.start()
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    c.assign([TopicPartition(pong, 0)])
    c.position(TopicPartition(pong, 0))
    ready.wait(30)
    p = KafkaProducer(bootstrap_servers=bootstrap)
    lat = []
    try:
        for i in range(n + warmup):
            payload = i.to_bytes(8, "little") + b"x" * 120
            t = time.perf_counter()
            p.send(ping, payload)
            got = False
            while not got:
                for recs in c.poll(timeout_ms=1000).values():
                    got = got or any(r.value[:8] == payload[:8] for r in recs)
                if time.perf_counter() - t > 30:
                    raise TimeoutError("raw ping-pong: no pong within 30 s")
            if i >= warmup:
                lat.append((time.perf_counter() - t) * 1000)
    finally:
        stop.set()
        th.join(timeout=5)
        c.close()
        p.close()
        admin.delete_topics([ping, pong])
        admin.close()
    return lat


def bench_rpc(cfg, bootstrap: str, n: int, warmup: int) -> list[float]:
    """RequestClient -> serve(null handler) -> reply, through kernelrl's topics."""
    from cluster.bus import Bus, RequestClient, serve
    from schemas import topics as T
    from schemas.messages import CompileRequest, CompileResult, RequestHeader

    bus = Bus(cfg, client_id="bench", bootstrap=bootstrap)
    bus.ensure_topics()
    stop, ready = threading.Event(), threading.Event()
    group = f"bench-null-{int(time.time() * 1000)}"

    def null(msg):
        return CompileResult(request_id=msg.header.request_id, episode_id=msg.episode_id, ok=True)

    th = threading.Thread(target=serve, args=(bus, T.TOOL_COMPILE, group, null, stop),
                          kwargs={"on_ready": ready.set}, daemon=True)
    th.start()
    ready.wait(30)
    client = RequestClient(bus, "bench-client")
    lat = []
    try:
        for i in range(n + warmup):
            req = CompileRequest(header=RequestHeader(), episode_id="ep-bench", files={"model_new.py": "x = 1\n"})
            t = time.perf_counter()
            client.request(T.TOOL_COMPILE, req, timeout_s=30, retries=0)
            if i >= warmup:
                lat.append((time.perf_counter() - t) * 1000)
    finally:
        stop.set()
        th.join(timeout=10)
        client.close()
        bus.close()
    return lat


def run_bench(args, cfg) -> dict:
    from cluster import broker

    started = False
    if not cfg.bus.bootstrap_servers and not broker.status(cfg)["running"]:
        broker.start(cfg)
        started = True
    try:
        bootstrap = broker.bootstrap_servers(cfg)
        n, warmup = args.requests, max(20, args.requests // 10)
        raw = bench_raw(cfg, bootstrap, n, warmup)
        rpc = bench_rpc(cfg, bootstrap, n, warmup)
        codec_ms = bench_codec()
    finally:
        if started:
            broker.stop(cfg)
    out = {
        "requests": n,
        "rtt_p50_ms": round(_pct(rpc, 0.5), 3), "rtt_p99_ms": round(_pct(rpc, 0.99), 3),
        "raw_rtt_p50_ms": round(_pct(raw, 0.5), 3), "raw_rtt_p99_ms": round(_pct(raw, 0.99), 3),
        "encode_decode_128k_ms": round(codec_ms, 3),
    }
    out["rtt_p50_ratio_vs_raw"] = round(out["rtt_p50_ms"] / out["raw_rtt_p50_ms"], 3)
    out["rtt_p99_ratio_vs_raw"] = round(out["rtt_p99_ms"] / out["raw_rtt_p99_ms"], 3)
    out["encode_decode_ratio_vs_target_5ms"] = round(codec_ms / 5.0, 3)
    out["targets_met"] = out["rtt_p50_ratio_vs_raw"] <= 1.2 and codec_ms <= 5.0
    out["broker"] = "embedded (started for this run)" if started else bootstrap
    return out
