"""The execution filter through a real evaluation worker over Kafka (`tasks synthesize|verify --via bus`).

One CPU eval worker serves FilterRequests (on the evaluate topic, next to evaluation
requests): a good task passes, broken ones are rejected by their rule, a crashing task is
contained and the worker goes on, an invalid filter config and a wrong backend are refused
by name; an undecodable or invalid FilterRequest is dead-lettered with its reason; an older
sender's ``EvaluateRequest(mode="filter")`` is still answered as before. `kernelrl tasks
synthesize --via bus` writes a task set whose every candidate went through the evaluate
topic as a FilterRequest (and none as the old evaluate request).
"""
from __future__ import annotations

import json

import pytest

from cluster.tasks.filter import FilterConfig
from tests.actors.workers import start_worker
from tests.conftest import KERNELRL, cfg_env
from tests.tasks.helpers import BROKEN, CRASH, GOOD


@pytest.fixture
def worker_cfg(make_cfg, spawn, tmp_path):
    cfg = make_cfg()
    start_worker(spawn, cfg, "eval", tmp_path)
    return cfg


def _scan(cfg, topic: str) -> list:
    from cluster.bus.client import Bus
    from cluster.bus.scan import read_topic

    bus = Bus(cfg, client_id="filter-test-scan")
    try:
        return [r.msg for r in read_topic(bus, topic)]
    finally:
        bus.close()


def _filter_requests(cfg) -> list:
    """The FilterRequests on the cpu evaluate topic (asserting no old-style filter request is among them)."""
    from schemas import topics
    from schemas.messages import FilterRequest

    msgs = _scan(cfg, topics.evaluate_topic("cpu"))
    assert not [m for m in msgs if getattr(m, "mode", "") == "filter"], "an EvaluateRequest(mode='filter') was sent"
    return [m for m in msgs if isinstance(m, FilterRequest)]


def _dead_letters(cfg, n: int, timeout_s: float = 60.0) -> list:
    import time

    from schemas import topics
    from schemas.messages import DeadLetter

    deadline = time.monotonic() + timeout_s
    while True:
        got = [m for m in _scan(cfg, topics.DLQ) if isinstance(m, DeadLetter)
               and m.source_topic == cfg.topic(topics.evaluate_topic("cpu"))]
        if len(got) >= n or time.monotonic() > deadline:
            return sorted(got, key=lambda d: (d.partition, d.offset))
        time.sleep(0.5)


def test_worker_filters_tasks_and_survives_bad_ones(worker_cfg):
    import msgpack

    from cluster.tasks.filter_bus import BusFilter, verdict_of
    from schemas import codec, topics
    from schemas.messages import (FAULT_INFRA, FAULT_NONE, FAULT_POLICY, EvaluateRequest, EvaluateResult, FilterRequest,
                                  FilterResult, RequestHeader)

    fcfg = FilterConfig(backend="cpu", min_ms=0.002, max_ms=20.0)
    check = BusFilter(worker_cfg, concurrency=2, timeout_s=60)
    topic = topics.evaluate_topic("cpu")
    try:
        names = ["good", "finite", "compile_mismatch", "crash", "good again"]
        out = check([GOOD, BROKEN["finite"], BROKEN["compile_mismatch"], CRASH, GOOD], fcfg)
        got = {n: (v.ok, v.rule) for n, v in zip(names, out)}
        assert got == {"good": (True, ""), "finite": (False, "finite"), "compile_mismatch": (False, "compile_mismatch"),
                       "crash": (False, "crash"), "good again": (True, "")}, out
        assert out[0].eager_ms > 0 and out[0].compile_ms > 0 and out[0].output_shape == [128, 256]

        # the result type itself: the verdict's numbers at the top level, the whole verdict, whose fault
        res = check.client.request(topic, FilterRequest(header=RequestHeader(), source=BROKEN["finite"],
                                                        filter=fcfg.to_dict(), timeout_s=60), timeout_s=120)
        assert isinstance(res, FilterResult) and res.fault == FAULT_POLICY and not res.ok and res.rule == "finite"
        assert res.verdict["rule"] == "finite" and res.eager_ms == res.verdict["eager_ms"]
        assert res.worker.startswith("eval-cpu@") and res.reason
        bad = check.client.request(topic, FilterRequest(header=RequestHeader(), source=GOOD,
                                                        filter={"trails": 3}), timeout_s=120)
        assert isinstance(bad, FilterResult) and not bad.ok and bad.rule == "invalid_request" and "trails" in bad.reason
        assert bad.fault == FAULT_INFRA and not bad.verdict and verdict_of(bad).rule == "invalid_request"
        wrong = check.client.request(topic, FilterRequest(header=RequestHeader(), source=GOOD,
                                                          filter={**fcfg.to_dict(), "backend": "cuda"}), timeout_s=120)
        assert wrong.rule == "worker_error" and "'cuda'" in wrong.reason and wrong.fault == FAULT_INFRA

        # an undecodable or invalid FilterRequest is dead-lettered with its reason; the worker goes on
        body = msgpack.unpackb(codec.encode(FilterRequest(header=RequestHeader(), source=GOOD)), raw=False)
        mistyped = msgpack.packb({**body, "d": {**body["d"], "timeout_s": "soon"}}, use_bin_type=True)
        missing = msgpack.packb({**body, "d": {k: v for k, v in body["d"].items() if k != "source"}},
                                use_bin_type=True)
        newer = msgpack.packb({**body, "v": 2, "r": 2}, use_bin_type=True)
        prod = check.bus.producer()
        for payload in (mistyped, missing, newer, b"\x93not msgpack"):
            prod.send_bytes(topic, payload, key="bad-filter")
        prod.flush(30)
        prod.close()
        letters = _dead_letters(worker_cfg, 4)
        reasons = sorted(d.error for d in letters)
        assert len(letters) == 4, reasons
        assert any("filter_request.timeout_s: expected float, got str" in r for r in reasons), reasons
        assert any("filter_request" in r and "missing required field(s) ['source']" in r for r in reasons), reasons
        assert any("filter_request: schema version 2" in r for r in reasons), reasons
        assert any("undecodable" in r for r in reasons), reasons
        assert {d.payload for d in letters} == {mistyped, missing, newer, b"\x93not msgpack"}

        # an older sender's EvaluateRequest(mode="filter") is answered as before
        old = check.client.request(topic, EvaluateRequest(
            header=RequestHeader(), episode_id="filter-old", task_id="old-sender", model_py=GOOD, files={},
            mode="filter", backend="cpu", options={"filter": fcfg.to_dict(), "timeout_s": 60}), timeout_s=120)
        assert isinstance(old, EvaluateResult) and old.correct and old.reward == 0.0 and old.fault == FAULT_NONE
        assert old.evidence["filter"]["ok"] and old.timings["eager_ms"] > 0 and old.task_id == "old-sender"
        old_bad = check.client.request(topic, EvaluateRequest(
            header=RequestHeader(), episode_id="filter-bad", task_id="bad-config", model_py=GOOD, files={},
            mode="filter", backend="cpu", options={"filter": {"trails": 3}}), timeout_s=120)
        assert not old_bad.correct and old_bad.violations == ["invalid_request"] and "trails" in old_bad.error
        assert check([GOOD], fcfg)[0].ok  # still serving
    finally:
        check.close()
    sent = _scan(worker_cfg, topic)
    assert len([m for m in sent if isinstance(m, FilterRequest)]) == 9
    assert len([m for m in sent if getattr(m, "mode", "") == "filter"]) == 2


def test_synthesize_via_bus_writes_tasks_checked_by_the_worker(worker_cfg, tmp_path):
    import subprocess

    out = tmp_path / "tasks"
    proc = subprocess.run([*KERNELRL, "tasks", "synthesize", "--n", "2", "--backend", "cpu", "--via", "bus",
                           "--workers", "2", "--out", str(out), "--seed", "5", "--eval-set", "",
                           "--max-candidates", "12"], env=cfg_env(worker_cfg), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    index = json.loads((out / "index.json").read_text())
    assert len(index["tasks"]) == 2 and summary["accepted"] == 2
    sent = _filter_requests(worker_cfg)
    assert len(sent) >= 2
    sent_sources = {m.source for m in sent}
    for t in index["tasks"]:
        assert (out / t["file"]).read_text() in sent_sources
        assert t["metadata"]["filter"]["eager_ms"] > 0

    again = subprocess.run([*KERNELRL, "tasks", "verify", "--dir", str(out), "--backend", "cpu", "--via", "bus"],
                           env=cfg_env(worker_cfg), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    assert "2/2 tasks pass the filter on cpu" in again.stdout
    assert len(_filter_requests(worker_cfg)) == len(sent) + 2
