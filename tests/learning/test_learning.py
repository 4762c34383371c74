"""The loop learns from the oracle: `kernelrl up` with the tiny model and a stage schedule (RFT on
demonstrations, critic, PPO on the policy's own samples) takes the pass rate of the actor's own episodes
from 0 to about 0.5-0.8, and every PPO step moves the policy toward the oracle's reward.

Everything is real: vLLM (CPU) samples at temperature 1, the compile and evaluation workers score every
episode over Kafka in their OS sandbox, the DeepSpeed learner trains, publishes each version over Kafka,
and the actor hot-swaps it. RFT starts from demonstrations (the task's solution replayed by the scripted
policy and scored by the oracle, tests/learning/tasks/relu.solution/). The curve is read back from the
trajectories topic (report["learning"]): each own episode counts for the policy version it was sampled with.

A broken loop fails here: a flipped advantage makes `reward_logp_cov` negative; log-probs off by one token,
or weights the actor never really swapped in, show as a KL between behaviour and learner log-probs, and RFT
cannot raise the pass rate (docs/learning.md records the breaks tried and their outcomes). Not asserted yet:
PPO raising the pass rate to >= 0.8 (issue 13).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cluster.launch.report import pass_rate
from tests.conftest import KERNELRL, cfg_env

TASKS = Path(__file__).parent / "tasks"
STAGES = "rft:2@3e-3,critic:1,ppo:6@2e-4"
STEPS = ["rft"] * 2 + ["critic"] + ["ppo"] * 6

# Single-turn episodes of the tiny model on one easy task; the oracle verifies only (reward +1 / -1), with
# its timing protocol trimmed to the minimum, since speed is not what is learned here. gamma = lambda = 1:
# with the reward on the last token, every token's advantage is r - V(s_t) (an untrained critic's values
# at lambda 0.95 penalised the early tokens of passing episodes and PPO collapsed, docs/learning.md).
LEARN = ["--set", "actor.episode_mode=single_turn", "--set", "actor.final_eval_mode=verify",
         "--set", "actor.max_new_tokens=264", "--set", "actor.concurrency=4", "--set", "actor.max_version_lag=2",
         "--set", "actor.temperature=1.0", "--set", "learner.batch_trajectories=4", "--set", "learner.rft_epochs=90",
         "--set", "learner.ppo_epochs=4", "--set", "learner.clip_low=0.1", "--set", "learner.lam=1.0",
         "--set", "learner.critic_lr=1e-3", "--set", "learner.max_staleness=2",
         "--set", "sandbox.compile_baseline=false", "--set", "sandbox.trials=5", "--set", "sandbox.warmup=1",
         "--set", "sandbox.correctness_trials=2", "--set", "sandbox.timing_budget_s=0.3"]


def run_learning(cfg, tiny_model: str, report: Path, stages: str = STAGES, extra: list[str] = (),
                 learn: list[str] = LEARN) -> dict:
    """`kernelrl up` on the learning task with ``learn`` settings (the candidate schedule of
    docs/learning/s10-candidate-test.py passes its own); the report, after checking the run ended well."""
    args = KERNELRL + list(learn) + ["--set", f"actor.model_path={tiny_model}", *extra,
                               "up", "--backend", "cpu", "--policy", "vllm", "--no-dashboard", "--tasks", str(TASKS),
                               "--stages", stages, "--report", str(report)]
    proc = subprocess.run(args, env=cfg_env(cfg), capture_output=True, text=True, timeout=1500)
    assert report.exists(), f"no report; rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    rep = json.loads(report.read_text())
    assert proc.returncode == 0, (rep.get("error"), proc.stderr[-4000:])
    return rep


def assert_ppo_steps_followed_the_actor_and_the_reward(rep: dict) -> None:
    # the learner's recomputed log-probs of the actor's tokens match the behaviour log-probs: the actor ran
    # exactly the published weights (a swap that did not take effect, or log-probs off by one token, would
    # show as a large KL between the two)
    ppo_steps = [c for c in rep["learner_curve"] if c["stage"] == "ppo"]
    kl = [c["kl_behaviour"] for c in ppo_steps]
    assert max(abs(k) for k in kl) < 0.05, kl
    # each PPO step moved the policy toward the oracle's reward: after the step's updates, the samples that
    # scored higher became more likely than those that scored lower (a flipped advantage makes this negative
    # in every step with mixed rewards, docs/learning.md)
    cov = [c["reward_logp_cov"] for c in ppo_steps]
    toward, away = [c for c in cov if c > 1e-6], [c for c in cov if c < -1e-6]
    assert len(toward) >= 2 and len(toward) > 2 * len(away), cov


@pytest.mark.timeout(1600)
def test_rft_then_ppo_on_the_real_loop_learn_from_the_oracle(cfg, tiny_model, tmp_path):
    rep = run_learning(cfg, tiny_model, tmp_path / "report.json")
    learning = rep["learning"]
    rows = learning["by_version"]
    print(json.dumps(learning, indent=1))  # the curve, in the test log

    assert rep["learner_steps"] == len(STEPS) and rep["trajectories_lost"] == 0
    assert [c["stage"] for c in rep["learner_curve"]] == STEPS
    # the demonstrations were scored by the oracle, not assumed
    assert learning["demonstrations"] >= 8 and learning["demonstrations_passed"] == learning["demonstrations"]
    # the random initial model never passes
    initial = [r for r in rows if r["version"] == 0]
    assert initial and initial[0]["pass_rate"] == 0.0, rows
    # RFT on the demonstrations, published and hot-swapped: the actor's own samples now pass
    rft_rate, rft_n = pass_rate([r for r in rows if r["stage"] in ("rft", "critic")])
    assert rft_n >= 4 and rft_rate >= 0.25, rows
    # PPO on the policy's own samples keeps them passing (over more steps it does not yet hold them:
    # docs/learning.md)
    ppo_rate, ppo_n = pass_rate([r for r in rows if r["stage"] == "ppo"])
    assert ppo_n >= 12 and ppo_rate >= 0.3, rows
    assert_ppo_steps_followed_the_actor_and_the_reward(rep)


@pytest.mark.timeout(1200)
def test_episode_mode_follows_the_stage_without_a_restart(cfg, tiny_model, tmp_path):
    """`actor.episode_mode = by_stage`: the actor samples single-turn episodes while the learner's next step is
    the warm-up (the recipe's stage 1), and multi-turn ones once it has applied the version the warm-up made,
    in one `up` run. A staleness bound of 0 makes the PPO step wait for episodes of the newest version (and
    makes the warm-up's leftover episodes stale: the learner must release them, or the task feeder's gate on
    the trajectory backlog stays shut and the run deadlocks, as it did before learner/role.py committed them)."""
    rep = run_learning(cfg, tiny_model, tmp_path / "report.json", stages="warmup:1,ppo:1",
                       extra=["--set", "actor.episode_mode=by_stage", "--set", "learner.max_staleness=0",
                              "--set", "learner.batch_trajectories=2", "--set", "actor.max_turns=2"])
    assert [c["stage"] for c in rep["learner_curve"]] == ["warmup", "ppo"], rep["learner_curve"]
    modes = {r["version"]: r["modes"] for r in rep["learning"]["by_version"]}
    assert modes.get(0) == ["single_turn"], modes
    assert modes.get(1) == ["multi_turn"], modes
