"""Pure math of the learner against hand-worked numbers: GAE, importance weights, PPO and value losses."""
from __future__ import annotations

import math
import types

import pytest
import torch

from learner.objective import PPOParams, gae, importance_weights, leave_one_out_baselines, ppo_policy_loss, value_loss

# pi_prox / mu = [1.5, 0.4, 3.0, 1.0]
PROX = torch.log(torch.tensor([0.6, 0.2, 0.9, 0.1]))
MU = torch.log(torch.tensor([0.4, 0.5, 0.3, 0.1]))


@pytest.mark.parametrize("mode,expected", [
    ("none", [1.0, 1.0, 1.0, 1.0]),
    ("tis", [1.5, 0.4, 2.0, 1.0]),          # min(rho, C=2)
    ("mask", [1.0, 0.0, 0.0, 1.0]),         # 1 inside [0.5, 2], else 0
    ("decoupled", [1.5, 0.0, 0.0, 1.0]),    # rho inside [0.5, 2], else 0
])
def test_importance_weights_hand_worked(mode, expected):
    w = importance_weights(PROX, MU, PPOParams(mode=mode, is_cap=2.0, mask_low=0.5, mask_high=2.0))
    assert torch.allclose(w, torch.tensor(expected), atol=1e-6), (mode, w)


def test_decoupled_ppo_loss_hand_worked():
    # r = pi / pi_prox = [1.1, 1.0, 1.0, 1.5]; A = [1, -1, 2, 1]; clip to [0.8, 1.28]
    logp = PROX + torch.log(torch.tensor([1.1, 1.0, 1.0, 1.5]))
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0])
    mask = torch.ones(4)
    loss, st = ppo_policy_loss(logp, PROX, MU, adv, mask, PPOParams(mode="decoupled"))
    # per token: -w * min(rA, clip(r)A) = -[1.5*1.1, 0, 0, 1*1.28]
    assert loss.item() == pytest.approx(-(1.65 + 1.28) / 4, abs=1e-5)
    assert st["clip_frac"].item() == pytest.approx(0.25)  # token 3: r = 1.5 > 1.28 with A > 0
    assert st["is_masked_frac"].item() == pytest.approx(0.5)
    assert st["is_w_max"].item() == pytest.approx(1.5, abs=1e-5)
    # k3 KL(mu||pi_prox) estimator on the 4 tokens: mean(rho - 1 - log rho)
    rho = [1.5, 0.4, 3.0, 1.0]
    assert st["kl_behaviour"].item() == pytest.approx(sum(r - 1 - math.log(r) for r in rho) / 4, abs=1e-5)


def test_none_mode_uses_behaviour_as_old_policy_and_gradient_flows():
    logp = MU.clone().requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, 0.0])
    loss, st = ppo_policy_loss(logp, PROX, MU, adv, torch.ones(4), PPOParams(mode="none"))
    assert st["ratio_mean"].item() == pytest.approx(1.0)
    loss.backward()
    # d/dlogp of -(r*A)/4 at r=1 is -A/4
    assert torch.allclose(logp.grad, -adv / 4)


def test_masked_tokens_do_not_count():
    logp = PROX.clone()
    adv = torch.tensor([1.0, 5.0, 5.0, 1.0])
    full, _ = ppo_policy_loss(logp, PROX, MU, adv, torch.tensor([1.0, 0, 0, 1.0]), PPOParams(mode="tis"))
    # only tokens 0 and 3 count: -(1.5*1 + 1*1)/2
    assert full.item() == pytest.approx(-1.25, abs=1e-6)


def test_gae_gamma1_lambda095_skips_observation_tokens():
    values = torch.tensor([9.0, 0.5, 7.0, 0.2])
    mask = torch.tensor([0, 1, 0, 1])
    adv, ret = gae(1.0, values, mask, gamma=1.0, lam=0.95)
    # last action: delta = 1 + 0 - 0.2 = 0.8; first action: delta = 0 + 0.2 - 0.5 = -0.3, gae = -0.3 + 0.95*0.8
    assert adv.tolist() == pytest.approx([0.0, 0.46, 0.0, 0.8], abs=1e-6)
    assert ret.tolist() == pytest.approx([0.0, 0.96, 0.0, 1.0], abs=1e-6)


def test_clipped_value_loss_hand_worked():
    v = torch.tensor([1.0, 0.0])
    old = torch.tensor([0.5, 0.0])
    ret = torch.tensor([0.0, 1.0])
    loss, st = value_loss(v, old, ret, torch.ones(2), clip=0.2)
    # token 0: max((1-0)^2, (0.7-0)^2) = 1; token 1: max(1, 1) = 1 -> 0.5 * mean = 0.5
    assert loss.item() == pytest.approx(0.5)
    assert st["value_clip_frac"].item() == pytest.approx(0.5)
    assert st["value_err"].item() == pytest.approx(1.0)


def test_leave_one_out_baseline_is_the_mean_of_the_other_episodes_of_the_task():
    s = types.SimpleNamespace
    samples = [s(episode_id="a", task_id="t", reward=1.0), s(episode_id="b", task_id="t", reward=1.0),
               s(episode_id="c", task_id="t", reward=-1.0), s(episode_id="d", task_id="u", reward=1.0)]
    base = leave_one_out_baselines(samples)
    assert base == {"a": 0.0, "b": 0.0, "c": 1.0}  # "d" is alone for its task: no baseline (GAE's instead)
    advantages = [x.reward - base[x.episode_id] for x in samples[:3]]
    assert advantages == [1.0, 1.0, -2.0] and sum(advantages) == 0.0  # one task's advantages cancel out
    everyone_passed = [s(episode_id=str(i), task_id="t", reward=1.0) for i in range(4)]
    assert all(1.0 - b == 0.0 for b in leave_one_out_baselines(everyone_passed).values())


def test_each_advantage_kind_picks_its_baseline():
    from learner.objective import episode_baselines

    s = types.SimpleNamespace
    samples = [s(episode_id="a", task_id="t", reward=1.0), s(episode_id="b", task_id="t", reward=-1.0)]
    assert episode_baselines("gae", samples) == {}  # the critic's GAE for every episode
    assert episode_baselines("rloo", samples) == {"a": -1.0, "b": 1.0}
    # reinforce: the reward itself on every token, an all-pass batch still pushes its samples up
    assert episode_baselines("reinforce", samples) == {"a": 0.0, "b": 0.0}
    # floor: the failure reward, so the failed episode's advantage is 0 and the passing one's 2
    floor = episode_baselines("floor", samples)
    assert {k: x.reward - floor[x.episode_id] for x in samples for k in [x.episode_id]} == {"a": 2.0, "b": 0.0}


def test_kl_to_reference_is_zero_at_the_reference_and_pulls_back_toward_it():
    from learner.objective import kl_to_reference

    ref = torch.tensor([[0.0, -1.0, -2.0, -0.5]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    assert float(kl_to_reference(ref.clone(), ref, mask, 3.0)) == 0.0
    logp = torch.tensor([[0.0, -0.5, -2.5, -0.5]], requires_grad=True)
    kl = kl_to_reference(logp, ref, mask, 3.0)
    d = ref - logp.detach()
    assert abs(float(kl) - float(((d.exp() - d - 1) * mask).sum() / 3.0)) < 1e-7 and float(kl) > 0
    kl.backward()
    # descending the penalty moves each masked log-prob toward the reference's; unmasked positions get nothing
    step = -logp.grad
    assert step[0, 1] < 0 and step[0, 2] > 0 and step[0, 3] == 0 and step[0, 0] == 0
