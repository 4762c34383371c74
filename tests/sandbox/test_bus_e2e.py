"""The CPU oracle end to end through the real broker: compile worker + evaluation worker subprocesses.

One evaluation worker serves, in order: an honest solution (timed, reward >= 1),
a segfault, a hang, a memory hog, and the honest solution again: the bad ones
are contained in their children and the worker keeps serving. SIGTERM stops
both workers cleanly; a job abandoned mid-run stays uncommitted.
"""
from __future__ import annotations

import signal
import time

import pytest

from tests.conftest import KERNELRL, cfg_env
from tests.sandbox.conftest import fast_sandbox
from tests.sandbox.helpers import ROOT, relu_with_body

EXAMPLE = ROOT / "skills" / "examples" / "cpu_19_relu"


def _wait_assigned(bus, group: str, topic: str, timeout: float = 60.0) -> None:
    """Until the worker's consumer group has joined (requests sent before may be skipped by 'latest')."""
    from kafka import KafkaAdminClient

    from cluster.bus.clients import admin_kwargs

    admin = KafkaAdminClient(**admin_kwargs(bus.cfg, "sbx-test-admin", bus.bootstrap))
    group = bus.group(group)  # groups carry the topic prefix (like topics)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            g = admin.describe_groups([group]).get(group) or {}
            if g.get("group_state") == "Stable" and g.get("members"):
                return
            time.sleep(0.3)
    finally:
        admin.close()
    raise AssertionError(f"consumer group {group} never became stable")


@pytest.fixture
def oracle_cfg(make_cfg, sandbox_cache):
    overrides = {f"sandbox__{k}": v for k, v in fast_sandbox(sandbox_cache).items()}
    overrides["sandbox__eval_timeout_s"] = 15.0  # the hang costs this much
    overrides["sandbox__eval_memory_limit_mb"] = 5120
    return make_cfg(**overrides)


def test_cpu_oracle_through_the_bus(oracle_cfg, spawn, tmp_path):
    from cluster.bus.client import Bus, RequestClient
    from sandbox_workers import workspace
    from schemas import topics
    from schemas.messages import CompileRequest, EvaluateRequest, RequestHeader

    env = cfg_env(oracle_cfg)
    logs = {}
    procs = {}
    # two builds at once in the compile worker (serve's ordered-commit pool), as on a big host
    for role, args in (("compile", ["compile-worker", "--jobs", "2"]), ("eval", ["eval-worker", "--device", "cpu"])):
        logs[role] = open(tmp_path / f"{role}.log", "wb")  # noqa: SIM115 - the child process writes it
        procs[role] = spawn([*KERNELRL, "-v", *args], env=env, stdout=logs[role], stderr=subprocess_stdout())
    bus = Bus(oracle_cfg, client_id="sbx-test")  # groups read from 'earliest': no need to wait for them
    client = RequestClient(bus, name="sbx-test-actor")
    task = (EXAMPLE / "model.py").read_text()
    good = workspace.read_dir(EXAMPLE)
    try:
        comp = client.request(topics.TOOL_COMPILE, CompileRequest(header=RequestHeader(), episode_id="ep-1",
                                                                  files=good, backend="cpu"), timeout_s=120, retries=0)
        assert comp.ok and comp.artifact and comp.artifact_key and comp.artifact_uri.startswith("file://"), comp
        bad = client.request(topics.TOOL_COMPILE, CompileRequest(header=RequestHeader(), episode_id="ep-1",
                                                                 files=relu_with_body("nonsense;"), backend="cpu"),
                             timeout_s=120, retries=0)
        assert not bad.ok and "nonsense" in bad.log

        def evaluate(files, mode="verify", **kw):
            req = EvaluateRequest(header=RequestHeader(), episode_id="ep-1", task_id="l1-19-relu", model_py=task,
                                  files=files, mode=mode, backend="cpu", **kw)
            return client.request(topics.evaluate_topic("cpu"), req, timeout_s=300, retries=0)

        first = evaluate(good, mode="both", artifact=comp.artifact, artifact_key=comp.artifact_key)
        assert first.compiled and first.correct and first.reward >= 1.0, (first.error, first.violations)
        assert first.evidence["compile"]["source"] == "cache"  # shared with the compile worker: no bytes needed
        assert first.timings["candidate"]["n"] >= 5 and first.timings["eager"]["median_s"] > 0
        assert first.timings["compile"]["median_s"] > 0 and first.speedup_vs_eager > 0

        crash = evaluate(relu_with_body("float* p = nullptr; for (int64_t i = 0; i < n; ++i) p[i * 4096] = 1.f;"))
        assert not crash.correct and crash.reward == -1.0 and "SIGSEGV" in crash.error, crash.error
        # never compiled before, and no artifact in the request: built by the compile worker, not the evaluator
        assert crash.evidence["compile"]["source"] in ("compile_worker", "cache"), crash.evidence["compile"]
        t0 = time.monotonic()
        hang = evaluate(relu_with_body("volatile int spin = 1; while (spin) { }"))
        assert not hang.correct and hang.reward == -1.0 and "deadline" in hang.error, hang.error
        assert time.monotonic() - t0 < 60
        hog = evaluate(relu_with_body("for (int64_t k = 0;; ++k) { float* q = new float[1 << 26]; "
                                      "for (int64_t i = 0; i < (1 << 26); i += 1024) q[i] = (float)k; }"))
        assert not hog.correct and hog.reward == -1.0 and hog.error, hog.error
        again = evaluate(good)
        assert again.correct and again.reward == 1.0, again.error
    finally:
        client.close()
    # a short flood of both topics (the stress tool) against the same workers
    from sandbox_workers.stress import run_stress

    report = run_stress(oracle_cfg, "cpu", duration_s=6.0, rate=2.0, eval_fraction=0.5, timeout_s=300,
                        examples="19_relu")
    assert report["sent"] >= 10 and report["timeouts"] == 0 and report["failed"] == 0, report
    assert report["compile"]["n"] + report["evaluate"]["n"] == report["sent"]
    assert report["throughput_per_s"] > 0 and report["compile"]["p50_s"] > 0
    assert report["lag_end"] == {"compile": 0, "evaluate": 0}
    assert report["worker_busy_fraction"] and all(0 < f <= 1 for f in report["worker_busy_fraction"].values())
    # where each evaluation's time went, from the workers' own results (evidence.phases) through the bus
    phases = report["evaluate_phases"]
    assert report["evaluate"]["n"] >= 1 and report["evaluations_per_min"] > 0, report
    # every evaluation says where its reference time came from (its own session, or the task's cached baselines)
    srcs = report["t_ref_source"]
    assert sum(srcs.values()) == report["evaluate"]["n"] and set(srcs) <= {"measured", "baselines"}, srcs
    # the device timeline from the evaluations' gate holds (no NVML here: no utilisation figures)
    tl = report["timeline"]
    assert tl["saturated_s"] > 0 and tl["exclusive_holds"] >= report["evaluate"]["n"], tl
    assert 0 < tl["exclusive_share"] <= 1 and "candidate.timing" in tl["exclusive_share_by_phase"], tl
    gaps = tl.get("handover_gap_s")  # each hand-over counted once by the jobs active in it (the replies name theirs)
    assert gaps is None or sum(r["n"] for r in gaps["by_active_jobs"].values()) == gaps["n"], tl
    # a timed trial's wall, split: the judge's preparation and check around the candidate's run round trip
    trial = report["timed_trial"]
    assert trial["run_s"]["p50_s"] >= trial["claimed_calls_s"]["p50_s"] > 0 and trial["trials"]["p50_s"] >= 5, trial
    assert trial["prep_s"]["p50_s"] > 0 and trial["check_s"]["p50_s"] > 0, trial
    for name in ("queue_s", "artifact_s", "candidate_s", "candidate.judge_start_s", "candidate.candidate.verify_s"):
        assert phases[name]["n"] >= 1 and phases[name]["p99_s"] >= phases[name]["p50_s"] >= 0, (name, phases)
    for role, p in procs.items():
        assert p.poll() is None, f"{role} worker died"
        p.send_signal(signal.SIGTERM)
    for role, p in procs.items():
        assert p.wait(timeout=30) == 0, (role, (tmp_path / f"{role}.log").read_text()[-3000:])
    assert bus.lag("eval-workers-cpu", [topics.evaluate_topic("cpu")])[topics.evaluate_topic("cpu")] == 0
    bus.close()


def test_the_artifact_comes_by_its_key_from_the_compile_worker(oracle_cfg, spawn, tmp_path):
    """The evaluation worker on another filesystem (its own empty artifact cache) gets requests without artifact
    bytes: it asks the compile workers for the artifact by the key it computes itself, keeps it, and refuses one
    built under another key (here: a compile worker with other compiler flags), building that one itself."""
    from cluster.bus.client import Bus, RequestClient
    from sandbox_workers import workspace
    from schemas import topics
    from schemas.messages import EvaluateRequest, RequestHeader

    base_env = cfg_env(oracle_cfg)
    eval_env = dict(base_env, KRL__SANDBOX__ARTIFACT_CACHE_DIR=str(tmp_path / "eval-artifacts"))
    other_env = dict(base_env, KRL__SANDBOX__CPU_FLAGS=oracle_cfg.sandbox.cpu_flags.replace("-O3", "-O2"))
    log = open(tmp_path / "workers.log", "wb")  # noqa: SIM115 - the child processes write it
    evaluator = spawn([*KERNELRL, "-v", "eval-worker", "--device", "cpu"], env=eval_env, stdout=log,
                      stderr=subprocess_stdout())
    odd = spawn([*KERNELRL, "-v", "compile-worker"], env=other_env, stdout=log, stderr=subprocess_stdout())
    bus = Bus(oracle_cfg, client_id="sbx-test3")
    client = RequestClient(bus, name="sbx-test3-actor")
    task = (EXAMPLE / "model.py").read_text()
    good = workspace.read_dir(EXAMPLE)
    kernel = next(p for p in good if p.startswith("kernels/"))

    def variant(tag: str) -> dict:  # the honest solution under a key no cache has seen yet
        return dict(good, **{kernel: good[kernel] + f"\n// {tag} {tmp_path.name}\n"})

    def evaluate(files):
        req = EvaluateRequest(header=RequestHeader(), episode_id="ep-3", task_id="l1-19-relu", model_py=task,
                              files=files, mode="verify", backend="cpu", artifact_key="the-actor-s-key")
        return client.request(topics.evaluate_topic("cpu"), req, timeout_s=300, retries=0)

    try:
        # a compile worker whose key differs (other flags): its artifact is refused, the worker builds its own
        refused = evaluate(variant("a"))
        comp = refused.evidence["compile"]
        assert refused.correct and refused.reward == 1.0, refused.error
        assert comp["source"] == "local_build" and "not this worker's" in comp["refused"], comp
        odd.send_signal(signal.SIGTERM)
        assert odd.wait(timeout=60) == 0
        spawn([*KERNELRL, "-v", "compile-worker"], env=base_env, stdout=log, stderr=subprocess_stdout())
        fetched = evaluate(variant("b"))
        comp = fetched.evidence["compile"]
        assert fetched.correct and fetched.reward == 1.0, fetched.error
        assert comp["source"] == "compile_worker" and comp["worker"].startswith("compile@"), comp
        assert (tmp_path / "eval-artifacts" / comp["key"][:2] / comp["key"]).is_dir()  # kept under its key
        again = evaluate(variant("b"))
        assert again.correct and again.evidence["compile"]["source"] == "cache", again.evidence["compile"]
        # the compile worker's verdict on sources that do not build is the policy's compile failure
        bad = evaluate(relu_with_body("nonsense;"))
        assert not bad.compiled and bad.reward == -1.0 and bad.fault == "policy", bad.error
        assert bad.evidence["compile"]["source"] == "compile_worker", bad.evidence["compile"]
        assert evaluator.poll() is None
    finally:
        client.close()
        bus.close()


def test_sigterm_abandons_the_running_job(oracle_cfg, spawn):
    from cluster.bus.client import Bus
    from schemas import topics
    from schemas.messages import EvaluateRequest, RequestHeader

    env = cfg_env(oracle_cfg)
    worker = spawn([*KERNELRL, "eval-worker", "--device", "cpu"], env=env)
    bus = Bus(oracle_cfg, client_id="sbx-test2")
    _wait_assigned(bus, "eval-workers-cpu", topics.evaluate_topic("cpu"))
    prod = bus.producer()
    req = EvaluateRequest(header=RequestHeader(), episode_id="ep-2", task_id="t", files=relu_with_body(
        "volatile int spin = 1; while (spin) { }"), model_py=(EXAMPLE / "model.py").read_text(), mode="verify")
    prod.send(topics.evaluate_topic("cpu"), req, key="ep-2").get(timeout=30)
    prod.close()
    time.sleep(8)  # compiled and running in its child by now (or still compiling: abandoned either way)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert bus.lag("eval-workers-cpu", [topics.evaluate_topic("cpu")])[topics.evaluate_topic("cpu")] == 1
    bus.close()


def subprocess_stdout():
    import subprocess

    return subprocess.STDOUT
