"""The stage schedule (learner.stages) and the ingest's stage switch: pure logic, no DeepSpeed."""
from __future__ import annotations

import pytest

from cluster.config import ConfigError, load
from learner.ingest import Ingest
from learner.stages import Schedule, parse

from .helpers import make_traj


def test_schedule_maps_steps_to_stages_and_learning_rates():
    s = Schedule(parse("rft:2@1e-3, critic:1, ppo:3@2e-4"), "ppo", 3e-6)
    assert s.total_steps == 6
    assert [s.at(i).stage for i in range(8)] == ["rft", "rft", "critic", "ppo", "ppo", "ppo", "ppo", "ppo"]
    assert [s.lr_at(i) for i in (0, 2, 3)] == [1e-3, 3e-6, 2e-4]
    assert s.describe() == "rft x2 @0.001 -> critic x1 -> ppo x3 @0.0002"
    plain = Schedule([], "rft", 1e-5)
    assert plain.total_steps == 0 and plain.at(99).stage == "rft" and plain.lr_at(5) == 1e-5


@pytest.mark.parametrize("bad, says", [("rft", "not stage:steps"), ("sft:3", "unknown stage 'sft'"),
                                       ("ppo:0", "steps > 0"), ("ppo:2@-1", "learning rate > 0"),
                                       ("ppo:2@x", "not stage:steps")])
def test_bad_schedules_are_refused_naming_the_field(bad, says):
    with pytest.raises(ConfigError, match="learner.stages") as exc:
        load(overrides=[f"learner.stages={bad}"])
    assert says in str(exc.value)


def test_stage_switch_rejudges_buffered_samples():
    """Samples RFT passed over while still buffered (a -1 of the policy's own) are PPO's to train on after the
    switch; demonstrations without log-probs are RFT's only."""
    ing = Ingest("rft", max_staleness=1)
    demo = make_traj("demo", reward=1.0)
    demo.has_logprobs = False
    for off, t in enumerate([demo, make_traj("own-fail", reward=-1.0), make_traj("own-pass", reward=1.0)]):
        ing.offer(t, 0, off)
    assert ing.ready() == 2  # demo and own-pass
    ing.set_stage("ppo")
    assert ing.ready() == 2  # own-fail and own-pass
    got = ing.take(5, policy_version=0)
    assert [s.episode_id for s in got] == ["own-fail", "own-pass"]
    assert ing.dropped == {"no_logprobs": 1} and ing.positions == {0: 3}


def test_rft_ignores_staleness_and_ppo_does_not():
    """RFT is supervised on filtered samples (the behaviour policy is not in its loss): old demonstrations
    are not stale there; the same sample is stale for PPO."""
    for stage, want in (("rft", ["old"]), ("ppo", [])):
        ing = Ingest(stage, max_staleness=2)
        ing.offer(make_traj("old", version=0, reward=1.0), 0, 0)
        assert [s.episode_id for s in ing.take(1, policy_version=10)] == want


def test_reward_alignment_is_the_covariance_of_reward_and_movement():
    """The learner's `reward_logp_cov`: positive when the higher-reward samples gained log-prob relative to
    the lower-reward ones; it reads rewards, not advantages, so a flipped advantage shows as negative."""
    import torch

    from learner.trainer import _add_movement, _reward_alignment

    base = torch.zeros(3, 4)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.float32)  # row 3: padding
    reward = torch.tensor([1.0, -1.0, 0.0])
    moved = [0.0] * 4
    _add_movement(moved, base + torch.tensor([[9.0, 0.2, 0.2, 9.0], [0, -0.3, -0.3, -0.3], [5, 5, 5, 5]]), base,
                  mask, reward)
    assert moved[3] == 2  # the padding row is not a sample
    assert _reward_alignment(moved) == pytest.approx((1 * 0.2 + -1 * -0.3) / 2 - 0 * (-0.1) / 2)
    flipped = [0.0] * 4
    _add_movement(flipped, base - torch.tensor([[0, 0.2, 0.2, 0], [0, -0.3, -0.3, -0.3], [0] * 4]), base, mask,
                  reward)
    assert _reward_alignment(flipped) < 0 < _reward_alignment(moved)
    assert _reward_alignment([0.0, 0.0, 0.0, 0.0]) == 0.0
