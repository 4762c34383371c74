"""The execution filter through a real evaluation worker over Kafka (`tasks synthesize|verify --via bus`).

One CPU eval worker serves filter requests: a good task passes, broken ones are
rejected by their rule, a crashing task is contained and the worker goes on, an
invalid filter config is refused by name; `kernelrl tasks synthesize --via bus`
writes a task set whose every candidate went through the evaluate topic.
"""
from __future__ import annotations

import json

import pytest

from actors.tasks.filter import FilterConfig
from tests.actors.workers import start_worker
from tests.conftest import KERNELRL, cfg_env
from tests.tasks.helpers import BROKEN, CRASH, GOOD


@pytest.fixture
def worker_cfg(make_cfg, spawn, tmp_path):
    cfg = make_cfg()
    start_worker(spawn, cfg, "eval", tmp_path)
    return cfg


def _filter_requests(cfg) -> list:
    from cluster.bus import Bus
    from cluster.bus_scan import read_topic
    from schemas import topics

    bus = Bus(cfg, client_id="filter-test-scan")
    try:
        return [r.msg for r in read_topic(bus, topics.evaluate_topic("cpu")) if getattr(r.msg, "mode", "") == "filter"]
    finally:
        bus.close()


def test_worker_filters_tasks_and_survives_bad_ones(worker_cfg):
    from actors.tasks.filter_bus import BusFilter
    from schemas import topics
    from schemas.messages import EvaluateRequest, RequestHeader

    fcfg = FilterConfig(backend="cpu", min_ms=0.002, max_ms=20.0)
    check = BusFilter(worker_cfg, concurrency=2, timeout_s=60)
    try:
        names = ["good", "finite", "compile_mismatch", "crash", "good again"]
        out = check([GOOD, BROKEN["finite"], BROKEN["compile_mismatch"], CRASH, GOOD], fcfg)
        got = {n: (v.ok, v.rule) for n, v in zip(names, out)}
        assert got == {"good": (True, ""), "finite": (False, "finite"), "compile_mismatch": (False, "compile_mismatch"),
                       "crash": (False, "crash"), "good again": (True, "")}, out
        assert out[0].eager_ms > 0 and out[0].compile_ms > 0 and out[0].output_shape == [128, 256]
        bad = check.client.request(topics.evaluate_topic("cpu"), EvaluateRequest(
            header=RequestHeader(), episode_id="filter-bad", task_id="bad-config", model_py=GOOD, files={},
            mode="filter", backend="cpu", options={"filter": {"trails": 3}}), timeout_s=120)
        assert not bad.correct and bad.violations == ["invalid_request"] and "trails" in bad.error
        assert check([GOOD], fcfg)[0].ok  # still serving
    finally:
        check.close()
    assert len(_filter_requests(worker_cfg)) == 7


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
    sent_sources = {m.model_py for m in sent}
    for t in index["tasks"]:
        assert (out / t["file"]).read_text() in sent_sources
        assert t["metadata"]["filter"]["eager_ms"] > 0

    again = subprocess.run([*KERNELRL, "tasks", "verify", "--dir", str(out), "--backend", "cpu", "--via", "bus"],
                           env=cfg_env(worker_cfg), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr[-2000:]
    assert "2/2 tasks pass the filter on cpu" in again.stdout
    assert len(_filter_requests(worker_cfg)) == len(sent) + 2
