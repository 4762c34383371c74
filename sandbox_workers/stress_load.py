"""How the stress tool sends its requests: open loop at a rate, or a closed loop bound to partitions; the warm-up
before the clock starts, and progress lines while the load runs."""
from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


def partition_keys(n: int) -> list[str]:
    """One request key per partition of an ``n``-partition topic: key ``p`` lands on partition ``p`` under
    kafka-python's default partitioner (murmur2, as Kafka's Java client)."""
    from kafka.partitioner.default import murmur2

    keys: list[str | None] = [None] * n
    j = 0
    while None in keys:
        k = f"stress-p{j}"
        p = (murmur2(k.encode()) & 0x7FFFFFFF) % n
        if keys[p] is None:
            keys[p] = k
        j += 1
    return keys


def topic_partitions(bus, topic: str) -> int:
    producer = bus.producer()
    try:
        return max(1, len(producer.partitions(topic) or ()))
    finally:
        producer.close()


def warm_up(one, keys: list[str]) -> dict:
    """One evaluation per key at once (so every worker of the group gets one), all answered, none counted: the
    first job of a fresh worker (and of the caches) is no part of its steady rate."""
    if not keys:
        return {"n": 0, "answered": 0, "s": 0.0}
    t0 = time.monotonic()
    log.info("warm-up: %d evaluations (one per worker)", len(keys))
    with ThreadPoolExecutor(max_workers=len(keys)) as pool:
        answered = sum(pool.map(lambda ik: one("evaluate", -1 - ik[0], key=ik[1], record=False),
                                enumerate(keys)))
    return {"n": len(keys), "answered": answered, "s": time.monotonic() - t0}


class Progress:
    """A line on the log every ``every_s`` seconds while the load runs (a stress run takes minutes)."""

    def __init__(self, duration_s: float, rec: dict, counts: dict, every_s: float = 15.0):
        self.duration_s, self.rec, self.counts, self.every_s = duration_s, rec, counts, every_s
        self.t0 = self.last = time.monotonic()

    def tick(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < self.every_s:
            return
        self.last = now
        done_e, done_c = len(self.rec["evaluate"]), len(self.rec["compile"])
        at = now - self.t0
        log.info("stress: %s, %d sent, %d evaluations and %d compiles answered (%.1f evaluations/min)",
                 f"{at:.0f}/{self.duration_s:.0f} s" if at < self.duration_s else f"{at:.0f} s, waiting for the replies",
                 self.counts["sent"], done_e, done_c, done_e / max(1e-9, at) * 60)


def open_loop(one, rate: float, duration_s: float, eval_fraction: float, rng: random.Random, counts: dict,
               concurrency: int, progress: Progress) -> None:
    """Requests at ``rate`` per second whatever the replies do, then wait for every reply."""
    t_start = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        i = 0
        while time.monotonic() - t_start < duration_s:
            progress.tick()
            due = t_start + i / rate
            now = time.monotonic()
            if due > now:
                time.sleep(min(due - now, 0.2))
                continue
            kind = "evaluate" if rng.random() < eval_fraction else "compile"
            pool.submit(one, kind, i)
            counts["sent"] += 1
            i += 1


def closed_loop(one, keys: list[str], depth: int, duration_s: float, eval_fraction: float, rng: random.Random,
                 counts: dict, lock: threading.Lock, progress: Progress) -> None:
    """``depth`` senders per partition, each sending its next request when the last is answered, until the
    duration is over; then every reply is waited for. Senders are bound to partitions (not to a random hash) so
    each worker of the group always has its share queued: a randomly routed closed loop leaves a worker idle
    for a fraction 1/(in flight + 1) of the time, enough to spoil a scaling figure."""
    end = time.monotonic() + duration_s
    seq = iter(range(1 << 62))

    def sender(key: str) -> None:
        while time.monotonic() < end:
            with lock:
                i = next(seq)
                kind = "evaluate" if rng.random() < eval_fraction else "compile"
                counts["sent"] += 1
            one(kind, i, key=key)

    threads = [threading.Thread(target=sender, args=(k,), name=f"stress-{k}", daemon=True)
               for k in keys for _ in range(depth)]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=1.0)
            progress.tick()
    progress.tick(force=True)
