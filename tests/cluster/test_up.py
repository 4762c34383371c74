"""`kernelrl up` end to end on the real broker, real vLLM (CPU), real DeepSpeed and the
CPU sandbox: the run report's invariants hold, also while roles are SIGKILLed."""
import json
import os
import subprocess

import pytest

from tests.conftest import KERNELRL, cfg_env

# Small enough for 2 cores: a few short episodes per learner step.
FAST = ["--set", "actor.max_turns=3", "--set", "actor.max_new_tokens=48", "--set", "actor.concurrency=2",
        "--set", "learner.batch_trajectories=2", "--set", "learner.token_budget=8192"]


def _up(cfg, tmp_path, *extra, timeout=1400):
    report = tmp_path / "report.json"
    env = cfg_env(cfg)
    env["KERNELRL_CACHE"] = os.environ.get("KERNELRL_CACHE", env.get("KERNELRL_CACHE", ""))
    if not env["KERNELRL_CACHE"]:
        env.pop("KERNELRL_CACHE")
    proc = subprocess.run(KERNELRL + FAST + ["up", "--backend", "cpu", "--no-dashboard", "--report", str(report),
                                             *extra], env=env, capture_output=True, text=True, timeout=timeout)
    assert report.exists(), f"no report; rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc, json.loads(report.read_text())


def _check_invariants(rep, steps):
    assert rep["learner_steps"] >= steps
    assert rep["trajectories_published"] >= steps * 2
    assert rep["trajectories_trained"] >= steps * 2
    assert rep["trajectories_lost"] == 0
    assert rep["tool_calls_lost"] == 0
    assert rep["trajectories_trained_twice"] == 0
    assert rep["weight_versions_published"] >= steps
    assert sum(rep["reward_histogram"].values()) == rep["episodes_finished"]
    assert all(os.path.exists(p) for p in rep["plots"])


@pytest.mark.timeout(1200)
def test_up_vllm_end_to_end(cfg, tmp_path):
    proc, rep = _up(cfg, tmp_path, "--max-steps", "2", "--policy", "vllm", "--scripted-actors", "1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    _check_invariants(rep, 2)
    assert rep["weight_versions_applied_min"] >= 1  # every actor hot-swapped at least once
    assert rep["tool_calls_sent"] >= 2  # the scripted actor's compile/verify went through the workers
    assert rep["killed_at_stop"] == []  # every role left on SIGTERM within its grace


@pytest.mark.timeout(1500)
def test_up_under_chaos_loses_nothing(cfg, tmp_path):
    # each role is killed at most once, so a short interval cannot starve the run, and a warm ~90 s run
    # still sees several kills (with 35 s, one run finished after a single kill)
    proc, rep = _up(cfg, tmp_path, "--max-steps", "2", "--policy", "vllm", "--scripted-actors", "1", "--chaos", "15")
    assert sum(rep["chaos_kills"].values()) >= 2, rep["chaos_kills"]
    _check_invariants(rep, 2)
    assert rep["tool_calls_sent"] >= 2
