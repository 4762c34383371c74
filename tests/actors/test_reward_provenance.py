"""Reward provenance over the real broker: the real worker handlers (served in-process, with faults
injected under them) answer with fault "infra"; the actor retries, and a reward the infrastructure
kept from being measured is marked undetermined, never a -1 or 0."""
from __future__ import annotations

import contextlib
import math
import threading

import pytest

from actors.agent import EpisodeLimits
from actors.policy import ScriptedPolicy
from actors.toolcall import format_call
from schemas import codec
from schemas import topics as T
from schemas.messages import REWARD_OK, REWARD_UNDETERMINED, CompileRequest, EvaluateRequest, Trajectory

from .helpers import make_episode, relu_solution, relu_task

FAST_SANDBOX = {"cpu_flush_mb": 8, "trials": 5, "max_trials": 20, "timing_budget_s": 0.3, "warmup": 2,
                "eval_timeout_s": 60.0, "compile_timeout_s": 60.0, "cpu_threads": 2, "compile_baseline": False}


@pytest.fixture
def pcfg(make_cfg, tmp_path):
    cfg = make_cfg(**{f"sandbox__{k}": v for k, v in FAST_SANDBOX.items()})
    cfg.sandbox.artifact_cache_dir = str(tmp_path / "artifacts")
    cfg.sandbox.baseline_cache_dir = str(tmp_path / "baselines")
    return cfg


@pytest.fixture
def rclient(pcfg):
    from cluster.bus.client import AsyncRequestClient, Bus

    bus = Bus(pcfg, client_id="actor-prov")
    client = AsyncRequestClient(bus, name="actor-prov")
    yield client
    client.close()
    bus.close()


@contextlib.contextmanager
def serving(cfg, handler, topic, expected):
    """The worker loop (cluster.bus.client.serve) around a real handler, on a thread, assigned before the block."""
    from cluster.bus.client import Bus, serve

    bus = Bus(cfg, client_id=f"worker-{topic}")
    stop, ready, out = threading.Event(), threading.Event(), {}

    def run():
        out["stats"] = serve(bus, topic, bus.group(f"workers-{topic}"), handler, stop, expected=expected,
                             on_ready=ready.set)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    try:
        assert ready.wait(30), "worker never got its partitions"
        yield out
    finally:
        stop.set()
        th.join(30)
        bus.close()


class Counting:
    """Counts the requests a handler answered (and keeps the replies)."""

    def __init__(self, handler):
        self.handler, self.replies = handler, []

    def __call__(self, msg):
        reply = self.handler(msg)
        self.replies.append(reply)
        return reply


def _fail_first(n: int, exc_factory, real):
    calls = {"n": 0}

    def wrapped(*a, **kw):
        calls["n"] += 1
        if calls["n"] <= n:
            raise exc_factory()
        return real(*a, **kw)
    return wrapped


def infra_result(why: str = "the baseline run failed: reference child died with SIGBUS") -> dict:
    """What the evaluator returns when its own side failed (task, judge, baseline, sandbox): fault "infra"."""
    return {"compiled": True, "correct": False, "reward": -1.0, "speedup_vs_eager": 0.0, "speedup_vs_compile": 0.0,
            "violations": [], "error": f"infrastructure: {why} (not the solution's fault)", "timings": {},
            "evidence": {}, "duration_s": 0.1, "fault": "infra"}


def write_calls(files):
    return [format_call("write", {"path": p, "content": t}) for p, t in files.items()]


def _observations(tokenizer, traj) -> list[str]:
    return [tokenizer.decode(traj.token_ids[a.gen_end:b.gen_start].tolist()) for a, b in zip(traj.turns,
                                                                                            traj.turns[1:])]


def test_infra_faults_are_retried_and_the_good_result_is_the_reward(aloop, tokenizer, pcfg, rclient, tmp_path,
                                                                   monkeypatch):
    from sandbox_workers import compiler
    from sandbox_workers.worker import CompileHandler, EvalHandler

    # compile: the first build dies with the worker's disk; evaluation: the first run hits a worker exception,
    # the second an infrastructure failure the evaluator reports itself (fault "infra"); the third is real
    monkeypatch.setattr(compiler, "compile_workspace",
                        _fail_first(1, lambda: OSError(28, "No space left on device"), compiler.compile_workspace))
    ehandler = EvalHandler(pcfg, "cpu")
    real_evaluate = ehandler.evaluator.evaluate
    state = {"n": 0}

    def flaky_evaluate(*a, **kw):
        state["n"] += 1
        if state["n"] == 1:
            raise RuntimeError("GPU health check failed (Xid 79)")
        if state["n"] == 2:
            return infra_result()
        return real_evaluate(*a, **kw)

    ehandler.evaluator.evaluate = flaky_evaluate
    comp, ev = Counting(CompileHandler(pcfg)), Counting(ehandler)
    script = write_calls(relu_solution()) + [format_call("profile", {}), format_call("finish", {})]
    with serving(pcfg, comp, T.TOOL_COMPILE, CompileRequest), \
            serving(pcfg, ev, T.evaluate_topic("cpu"), EvaluateRequest):
        ep = make_episode(ScriptedPolicy(tokenizer, script), relu_task(), tmp_path / "ws", EpisodeLimits(max_turns=10),
                          client=rclient, tool_timeout_s=120)
        ep.remote.infra_backoff_s = 0.05
        traj = aloop.run(ep.run(), timeout=600)
    ehandler.close()

    assert [r.fault for r in comp.replies] == ["infra", "none"]
    assert [r.fault for r in ev.replies] == ["infra", "infra", "none"]
    assert ev.replies[1].reward == 0.0 and "baseline run failed" in ev.replies[1].error  # never the policy's -1
    good = ev.replies[-1]
    assert good.correct and good.reward >= 1.0
    (rec,) = ep.remote.evaluations  # the infra replies are no evaluation of the workspace
    assert rec.result.request_id == good.request_id
    assert traj.reward_status == REWARD_OK and traj.reward == good.reward
    assert traj.evidence["request_id"] == good.request_id and traj.evidence["infra"]["retries"] == 3
    assert traj.evidence["stats"]["final_eval_s"] == 0.0  # the profile covered the final workspace
    obs = _observations(tokenizer, traj)[2]  # the profile call's observation
    assert "correct: True" in obs and "infrastructure" not in obs


def test_persistent_infra_fault_leaves_the_reward_undetermined(aloop, tokenizer, pcfg, rclient, tmp_path):
    from learner.ingest import Ingest
    from sandbox_workers.worker import CompileHandler, EvalHandler

    ehandler = EvalHandler(pcfg, "cpu")
    ehandler.evaluator.evaluate = lambda *a, **kw: infra_result()
    comp, ev = Counting(CompileHandler(pcfg)), Counting(ehandler)
    script = write_calls(relu_solution()) + [format_call("verify", {}), format_call("finish", {})]
    with serving(pcfg, comp, T.TOOL_COMPILE, CompileRequest), \
            serving(pcfg, ev, T.evaluate_topic("cpu"), EvaluateRequest):
        ep = make_episode(ScriptedPolicy(tokenizer, script), relu_task(), tmp_path / "ws", EpisodeLimits(max_turns=10),
                          client=rclient, tool_timeout_s=120)
        ep.remote.infra_backoff_s = 0.05
        traj = aloop.run(ep.run(), timeout=600)
    ehandler.close()

    # verify: 1 + 2 retries; the final evaluation: 1 + 2 retries; each an infra reply, reward 0.0 on the wire
    assert len(ev.replies) == 6 and {r.fault for r in ev.replies} == {"infra"}
    assert len(comp.replies) == 1  # the sources compiled once; the final evaluation reused it
    obs = _observations(tokenizer, traj)[2]  # what the model read after verify
    assert "infrastructure failure (not caused by your code)" in obs and "baseline run failed" in obs
    assert "correct:" not in obs and "reward:" not in obs
    assert ep.remote.evaluations == [] and len(ep.remote.infra_faults) == 2

    assert traj.reward_status == REWARD_UNDETERMINED and math.isnan(traj.reward)  # not -1, not 0
    assert "final evaluation failed (infrastructure)" in traj.evidence["undetermined"]
    assert traj.evidence["infra"]["retries"] == 4 and traj.end_reason == "finish"

    # on the wire and into the learner: skipped and counted, its offset consumed
    back = codec.decode(codec.encode(traj), expected=Trajectory)
    assert back.reward_status == REWARD_UNDETERMINED and math.isnan(back.reward)
    ing = Ingest("ppo", max_staleness=4)
    ing.offer(back, 0, 0)
    assert ing.take(4, 0) == [] and ing.skipped_undetermined == 1 and ing.positions == {0: 1}
