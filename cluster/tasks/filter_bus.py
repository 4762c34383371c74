"""The execution filter run by the evaluation workers over Kafka (`tasks synthesize|verify --via bus`).

Each candidate goes out as a ``FilterRequest`` (schemas.messages) on the evaluate topic
of the filter's backend, so the filter scales with the cluster's eval workers (and
GPU-sized tasks are measured on the workers' GPUs); the worker answers with a
``FilterResult`` holding the verdict. Up to ``concurrency`` requests are in flight; a
request that times out or cannot be sent becomes a rejected verdict (rule
``unanswered``), never a lost task, and so does one the worker could not judge
(rule ``invalid_request`` or ``worker_error``).
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from cluster.tasks.filter import FilterConfig, Verdict

log = logging.getLogger(__name__)
START_S = 60.0  # a worker's first filter request also pays for its child's torch import


class BusFilter:
    def __init__(self, cfg, concurrency: int = 4, timeout_s: float = 180.0):
        from cluster.bus.client import Bus, RequestClient
        from schemas.messages import new_id

        self.concurrency, self.timeout_s = max(1, concurrency), timeout_s
        self.bus = Bus(cfg, client_id="kernelrl-tasks-filter")
        self.client = RequestClient(self.bus, name=f"kernelrl-tasks-filter-{new_id()[:8]}")

    def __call__(self, sources: list[str], fcfg: FilterConfig) -> list[Verdict]:
        if not sources:
            return []
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(sources))) as pool:
            return list(pool.map(lambda s: self.check(s, fcfg), sources))

    def check(self, source: str, fcfg: FilterConfig) -> Verdict:
        from cluster.errors import KernelRLError
        from schemas import topics
        from schemas.messages import FilterRequest, RequestHeader

        req = FilterRequest(header=RequestHeader(), source=source, filter=fcfg.to_dict(), timeout_s=self.timeout_s)
        try:
            res = self.client.request(topics.evaluate_topic(fcfg.backend), req,
                                      timeout_s=self.timeout_s + START_S + 30.0)
        except KernelRLError as exc:
            log.warning("filter request %s: %s", req.header.request_id, exc)
            return Verdict(ok=False, rule="unanswered", reason=f"{type(exc).__name__}: {exc}")
        return verdict_of(res)

    def close(self) -> None:
        self.client.close()
        self.bus.close()


def verdict_of(res) -> Verdict:
    """The Verdict a FilterResult carries; one without a verdict (the worker refused or failed) is a rejection."""
    if res.verdict:
        return Verdict(**{k: v for k, v in res.verdict.items() if k in Verdict.__dataclass_fields__})
    return Verdict(ok=False, rule=res.rule or "worker_error", reason=res.reason, duration_s=res.duration_s)
