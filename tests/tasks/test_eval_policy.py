"""`kernelrl eval --policy openai|vllm`: agent episodes through real compile and evaluation workers over Kafka.

openai: a local chat endpoint scripts the model; on the first task it writes the shipped
ReLU solution and finishes, on the second it finishes without writing one, so the
report's pass rate is exactly 1/2. vllm: the tiny local model in an in-process vLLM
engine runs a capped episode; whatever it writes is evaluated and reported.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from actors.toolcall import format_call
from tests.chat_endpoint import Endpoint
from tests.actors.workers import start_worker
from tests.conftest import KERNELRL, ROOT, cfg_env

RELU = ROOT / "skills" / "examples" / "cpu_19_relu"


@pytest.fixture
def cluster(make_cfg, spawn, tmp_path):
    cache = tmp_path / "sandbox-cache"
    cfg = make_cfg(sandbox__trials=5, sandbox__max_trials=15, sandbox__timing_budget_s=0.3, sandbox__warmup=2,
                   sandbox__cpu_flush_mb=8, sandbox__eval_timeout_s=120.0, sandbox__compile_timeout_s=120.0,
                   sandbox__artifact_cache_dir=str(cache / "artifacts"),
                   sandbox__baseline_cache_dir=str(cache / "baselines"), actor__workspace_root=str(tmp_path / "ws"))
    for kind in ("compile", "eval"):
        start_worker(spawn, cfg, kind, tmp_path)
    tasks = tmp_path / "tasks" / "level1"
    tasks.mkdir(parents=True)
    for name in ("1_ReLU.py", "2_ReLUAgain.py"):
        (tasks / name).write_text((RELU / "model.py").read_text())
    return cfg, tmp_path


def _eval(cfg, tmp_path, *args, env_extra=None) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / "report"
    env = {**cfg_env(cfg), **(env_extra or {})}
    proc = subprocess.run([*KERNELRL, "eval", "--tasks", str(tmp_path / "tasks"), "--backend", "cpu",
                           "--out", str(out), "--json", *args], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "eval.json").read_text()), proc


def test_eval_openai_policy_reports_the_exact_pass_rate(cluster, tiny_model):
    cfg, tmp_path = cluster
    solution = [format_call("write", {"path": "model_new.py", "content": (RELU / "model_new.py").read_text()}),
                format_call("write", {"path": "kernels/relu.cpp", "content": (RELU / "kernels" / "relu.cpp").read_text()}),
                format_call("finish", {})]
    srv = Endpoint([*solution, format_call("finish", {})])
    try:
        rep, _ = _eval(cfg, tmp_path, "--policy", "openai", "--model-path", tiny_model,
                       env_extra={"KRL__ACTOR__OPENAI_BASE_URL": srv.url, "KRL__ACTOR__OPENAI_MODEL": "scripted-m"})
    finally:
        srv.close()
    assert len(srv.requests) == 4 and all(body["model"] == "scripted-m" for _, _, body in srv.requests)
    by = {t["name"]: t for t in rep["tasks"]}
    assert set(by) == {"1_ReLU", "2_ReLUAgain"}
    assert by["1_ReLU"]["correct"] and by["1_ReLU"]["compiled"] and by["1_ReLU"]["speedup_vs_eager"] > 0
    assert not by["2_ReLUAgain"]["correct"]
    assert rep["overall"]["pass_rate"] == pytest.approx(0.5)
    assert rep["overall"]["fast_p"]["eager"]["0"] == pytest.approx(0.5)
    assert rep["meta"]["policy"] == "openai"


def test_eval_vllm_policy_runs_capped_episodes(cluster, tiny_model):
    cfg, tmp_path = cluster
    rep, _ = _eval(cfg, tmp_path, "--policy", "vllm", "--model-path", tiny_model, "--limit", "1",
                   env_extra={"KRL__ACTOR__EVAL_MAX_TURNS": "2", "KRL__ACTOR__MAX_NEW_TOKENS": "48",
                              "KRL__ACTOR__MAX_CONTEXT_TOKENS": "16384", "KRL__ACTOR__KV_CACHE_MB": "64",
                              "TORCH_COMPILE_DISABLE": "1"})
    assert rep["meta"]["policy"] == "vllm" and len(rep["tasks"]) == 1
    task = rep["tasks"][0]
    # random weights write no kernel: the final evaluation of the starter workspace fails, and says so
    assert task["has_solution"] and not task["correct"]
    assert rep["overall"]["pass_rate"] == 0.0


def test_eval_solutions_over_the_bus_send_the_artifact_key_not_its_bytes(cluster):
    """`eval --via bus`: compile then evaluate through the workers; the EvaluateRequest names the compiled
    artifact by content key (the evaluation worker fetches it), with no inline bytes."""
    import shutil

    from cluster.bus.client import Bus
    from cluster.bus.scan import read_topic
    from schemas import topics
    from schemas.messages import EvaluateRequest

    cfg, tmp_path = cluster
    shutil.copytree(RELU, tmp_path / "solutions" / "1_ReLU", ignore=shutil.ignore_patterns("model.py"))
    rep, _ = _eval(cfg, tmp_path, "--policy", "solutions", "--solutions", str(tmp_path / "solutions"),
                   "--via", "bus")
    by = {t["name"]: t for t in rep["tasks"]}
    assert by["1_ReLU"]["correct"] and by["1_ReLU"]["compiled"], by["1_ReLU"]
    assert not by["2_ReLUAgain"]["has_solution"]
    assert rep["meta"]["via"] == "bus" and rep["overall"]["pass_rate"] == pytest.approx(0.5)
    bus = Bus(cfg, client_id="eval-test-scan")
    try:
        reqs = [r.msg for r in read_topic(bus, topics.evaluate_topic("cpu")) if isinstance(r.msg, EvaluateRequest)]
    finally:
        bus.close()
    assert len(reqs) == 1 and reqs[0].task_id == by["1_ReLU"]["task_id"], reqs
    assert reqs[0].artifact_key and reqs[0].artifact == b"", (reqs[0].artifact_key, len(reqs[0].artifact))
