"""`kernelrl up` with cluster.learner_ranks = 2 on the CPU backend: the supervisor starts the learner role under
torchrun (two gloo ranks), the whole loop (real broker, vLLM actor, workers) trains its steps and the report
holds its invariants (about 2 minutes on 2 cores)."""
import json
import subprocess

import pytest

from tests.conftest import KERNELRL, cfg_env

FAST = ["--set", "cluster.model=tiny", "--set", "actor.max_turns=3", "--set", "actor.max_new_tokens=48",
        "--set", "actor.concurrency=2", "--set", "learner.batch_trajectories=2", "--set", "learner.token_budget=8192"]


@pytest.mark.timeout(900)
def test_up_runs_the_learner_as_two_torchrun_ranks(cfg, tmp_path):
    report = tmp_path / "report.json"
    env = cfg_env(cfg)
    proc = subprocess.run(KERNELRL + FAST + ["--set", "cluster.learner_ranks=2", "up", "--backend", "cpu",
                                             "--no-dashboard", "--report", str(report), "--max-steps", "2",
                                             "--policy", "vllm"], env=env, capture_output=True, text=True,
                          timeout=850)
    assert report.exists(), proc.stderr[-4000:]
    rep = json.loads(report.read_text())
    assert proc.returncode == 0, (rep, proc.stderr[-4000:])
    assert rep["ok"] and rep["learner_steps"] >= 2 and rep["trajectories_trained"] >= 4
    assert rep["trajectories_lost"] == 0 and rep["trajectories_trained_twice"] == 0
    assert rep["restarts"]["learner"] == 0 and rep["killed_at_stop"] == [] and rep["gpu_placement"] is None
    assert rep["weight_versions_applied_min"] >= 1
    from pathlib import Path

    log = (Path(rep["run_dir"]) / "logs" / "learner.log").read_text()
    assert "torch.distributed.run" in log  # the supervisor's start line: the launcher, then the CLI
    for rank in (0, 1):
        assert f"learner rank {rank} of 2 (from torchrun" in log, log[-3000:]
