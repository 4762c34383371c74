"""`kernelrl bench bus`: request/reply RTT through our bus vs plain kafka-python, and codec speed.

All numbers come from the same run on the same broker: ``raw_*`` is a ping-pong of
plain kafka-python producers/consumers through two topics (library defaults, manual
assignment), ``rtt_*`` is RequestClient -> serve() with a null handler -> reply. The
two are interleaved request by request so machine noise hits both alike.
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


class RawPingPong:
    """Plain kafka-python ping-pong through two single-partition topics (library defaults)."""

    def __init__(self, cfg, bootstrap: str):
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

        stamp = f"{int(time.time() * 1000)}"
        self.ping = f"{cfg.bus.topic_prefix}bench.ping.{stamp}"
        self.pong = f"{cfg.bus.topic_prefix}bench.pong.{stamp}"
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        self.admin.create_topics({self.ping: {"num_partitions": 1, "replication_factor": 1},
                                  self.pong: {"num_partitions": 1, "replication_factor": 1}},
                                 wait_for_metadata=True)
        self.stop, ready = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._ponger, args=(bootstrap, ready), daemon=True)
        self.thread.start()
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        tp = TopicPartition(self.pong, 0)
        self.consumer.assign([tp])
        self.consumer.position(tp)
        self.producer = KafkaProducer(bootstrap_servers=bootstrap)
        self.n = 0
        if not ready.wait(30):
            raise TimeoutError("raw ponger did not start")

    def _ponger(self, bootstrap: str, ready: threading.Event) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        c.assign([TopicPartition(self.ping, 0)])
        c.position(TopicPartition(self.ping, 0))
        p = KafkaProducer(bootstrap_servers=bootstrap)
        ready.set()
        while not self.stop.is_set():
            for recs in c.poll(timeout_ms=100).values():
                for r in recs:
                    p.send(self.pong, r.value)
        c.close()
        p.close()

    def one(self) -> float:
        self.n += 1
        payload = self.n.to_bytes(8, "little") + b"x" * 120
        t = time.perf_counter()
        self.producer.send(self.ping, payload)
        while True:
            for recs in self.consumer.poll(timeout_ms=1000).values():
                if any(r.value[:8] == payload[:8] for r in recs):
                    return (time.perf_counter() - t) * 1000
            if time.perf_counter() - t > 30:
                raise TimeoutError("raw ping-pong: no pong within 30 s")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.consumer.close()
        self.producer.close()
        self.admin.delete_topics([self.ping, self.pong])
        self.admin.close()


class RpcPingPong:
    """RequestClient -> serve(null handler) -> reply, through kernelrl's topics."""

    def __init__(self, cfg, bootstrap: str):
        from cluster.bus.client import Bus, RequestClient, serve
        from schemas import topics as T

        self.bus = Bus(cfg, client_id="bench", bootstrap=bootstrap)
        self.bus.ensure_topics()
        self.stop, ready = threading.Event(), threading.Event()
        group = f"bench-null-{int(time.time() * 1000)}"
        self.thread = threading.Thread(target=serve, args=(self.bus, T.TOOL_COMPILE, group, self._null, self.stop),
                                       kwargs={"on_ready": ready.set}, daemon=True)
        self.thread.start()
        if not ready.wait(30):
            raise TimeoutError("null worker did not join its group")
        self.client = RequestClient(self.bus, "bench-client")

    @staticmethod
    def _null(msg):
        from schemas.messages import CompileResult

        return CompileResult(request_id=msg.header.request_id, episode_id=msg.episode_id, ok=True)

    def one(self) -> float:
        from schemas import topics as T
        from schemas.messages import CompileRequest, RequestHeader

        req = CompileRequest(header=RequestHeader(), episode_id="ep-bench", files={"model_new.py": "x = 1\n"})
        t = time.perf_counter()
        self.client.request(T.TOOL_COMPILE, req, timeout_s=30, retries=0)
        return (time.perf_counter() - t) * 1000

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.client.close()
        self.bus.close()


def bench_rtt(cfg, bootstrap: str, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """Interleave raw and bus round trips so both see the same machine load."""
    raw, rpc = RawPingPong(cfg, bootstrap), RpcPingPong(cfg, bootstrap)
    raw_lat, rpc_lat = [], []
    try:
        for i in range(n + warmup):
            pair = (raw.one(), rpc.one()) if i % 2 else tuple(reversed((rpc.one(), raw.one())))
            if i >= warmup:
                raw_lat.append(pair[0])
                rpc_lat.append(pair[1])
    finally:
        raw.close()
        rpc.close()
    return raw_lat, rpc_lat


def run_bench(args, cfg) -> dict:
    from cluster.broker import embedded as broker

    started = False
    if not cfg.bus.bootstrap_servers and not broker.status(cfg)["running"]:
        broker.start(cfg, tie_to_parent=True)
        started = True
    try:
        bootstrap = broker.bootstrap_servers(cfg)
        n, warmup = args.requests, max(20, args.requests // 10)
        raw, rpc = bench_rtt(cfg, bootstrap, n, warmup)
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
