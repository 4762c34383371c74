"""Each stage's objective falls on a fixed batch (real DeepSpeed, CPU, gloo, tiny model)."""
from __future__ import annotations

import pytest
import torch

from learner.data import collate, from_trajectory

from .conftest import learner_cfg
from .helpers import make_traj


def _batch(n=4, length=40):
    return [from_trajectory(make_traj(f"e{i}", n=length + 8 * i, prompt=8, seed=i, reward=1.0 if i % 2 else -1.0,
                                      obs=(20, 24))) for i in range(n)]


def _trainer(tiny_model, **learner):
    from learner.trainer import Trainer

    return Trainer(learner_cfg(**learner), tiny_model)


@pytest.mark.parametrize("stage", ["rft", "critic"])
def test_supervised_stages_loss_falls(ds_process, tiny_model, stage):
    tr = _trainer(tiny_model, stage=stage, zero_stage=1)
    batch = _batch()
    if stage == "rft":
        batch = [s for s in batch if s.reward > 0]
    before = tr.eval_loss(batch)
    losses = [tr.step(batch)["loss" if stage == "rft" else "value_loss"] for _ in range(5)]
    after = tr.eval_loss(batch)
    assert after < 0.85 * before, (stage, before, after, losses)
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


@pytest.mark.parametrize("stage,mode", [("warmup", "none"), ("ppo", "decoupled"), ("ppo", "tis")])
def test_ppo_stages_move_policy_toward_advantage(ds_process, tiny_model, stage, mode):
    tr = _trainer(tiny_model, stage=stage, off_policy=mode, zero_stage=2)
    batch = _batch()
    for s in batch:  # behaviour = the policy itself, so importance weights start at 1
        mb = collate([s])
        with torch.no_grad():
            s.logprobs = tr._logp(mb)[0][0].numpy().astype("float32") * s.loss_mask
    first = tr.step(batch)
    for _ in range(4):
        last = tr.step(batch)
    assert last["value_loss"] < first["value_loss"]
    if mode == "none":  # fixed old policy: the clipped surrogate itself must fall
        assert last["policy_loss"] < first["policy_loss"]
    assert first["is_w_mean"] == pytest.approx(1.0, abs=1e-3)
    assert last["kl_behaviour"] > first["kl_behaviour"]
    with torch.no_grad():
        pos = [s for s in batch if s.reward > 0]
        neg = [s for s in batch if s.reward < 0]
        def mean_gain(group):
            tot = 0.0
            for s in group:
                lp = tr._logp(collate([s]))[0][0].numpy()
                tot += float(((lp - s.logprobs) * s.loss_mask).sum() / s.loss_mask.sum())
            return tot / len(group)
        assert mean_gain(pos) > 0 > mean_gain(neg)
    for key in ("clip_frac", "is_masked_frac", "entropy", "value_err", "tokens"):
        assert key in last


def test_kl_to_the_reference_holds_ppo_near_the_policy_it_started_from(ds_process, tiny_model):
    """learner.kl_ref_coef: the policy as PPO began is snapshotted at the first PPO step; the penalty keeps the
    policy's log-probs of the sampled tokens nearer to it than the same steps without it (real DeepSpeed)."""
    drift = {}
    for coef in (0.0, 20.0):
        tr = _trainer(tiny_model, stage="ppo", off_policy="decoupled", zero_stage=1, kl_ref_coef=coef)
        batch = _batch()
        for s in batch:
            with torch.no_grad():
                s.logprobs = tr._logp(collate([s]))[0][0].numpy().astype("float32") * s.loss_mask
        steps = [tr.step(batch) for _ in range(5)]
        assert (tr.reference is not None) == (coef > 0)
        if coef > 0:
            assert steps[0]["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # the first step starts at the reference
            assert steps[-1]["kl_ref"] > 0
        else:
            assert "kl_ref" not in steps[-1]
        with torch.no_grad():
            drift[coef] = sum(float((abs(tr._logp(collate([s]))[0][0].numpy() - s.logprobs) * s.loss_mask).sum())
                              for s in batch)
    assert drift[20.0] < 0.7 * drift[0.0], drift


def test_floor_advantage_leaves_failures_alone_and_pushes_passing_episodes_up(ds_process, tiny_model):
    """learner.advantage = "floor": the baseline is the failure reward, so an all-failed batch moves nothing
    and a mixed one raises the passing episodes' log-probs; learner.adam_beta2 reaches DeepSpeed's AdamW."""
    tr = _trainer(tiny_model, stage="ppo", off_policy="decoupled", zero_stage=1, advantage="floor", adam_beta2=0.95)
    assert tuple(tr.policy.optimizer.param_groups[0]["betas"]) == (0.9, 0.95)
    batch = _batch()
    for s in batch:
        with torch.no_grad():
            s.logprobs = tr._logp(collate([s]))[0][0].numpy().astype("float32") * s.loss_mask

    def gain(group):
        with torch.no_grad():
            return [float(((tr._logp(collate([s]))[0][0].numpy() - s.logprobs) * s.loss_mask).sum()) for s in group]

    failed = [s for s in batch if s.reward < 0]
    out = tr.step(failed)
    assert out["policy_loss"] == 0.0 and max(abs(g) for g in gain(batch)) < 1e-4, gain(batch)
    assert "value_loss" not in out  # the advantages need no critic: the step leaves it untrained
    for _ in range(3):
        tr.step(batch)
    assert min(gain([s for s in batch if s.reward > 0])) > 0.5


def test_rft_trains_a_repeated_demonstration_once_with_its_weight(ds_process, tiny_model):
    """A demonstration replayed three times is one row standing for three: RFT's loss is the mean over all
    four episodes' tokens, as if each copy were computed, with a third of the copies' compute."""
    import dataclasses

    tr = _trainer(tiny_model, stage="rft", zero_stage=1)
    a, b = [s for s in _batch() if s.reward > 0][:2]
    copies = [dataclasses.replace(a, episode_id=f"a{i}") for i in range(3)] + [b]
    with torch.no_grad():
        nll = {s.episode_id: float(-(tr._logp(collate([s]))[0][0] * collate([s]).loss_mask[0]).sum()) for s in (a, b)}
    n = {s.episode_id: float(s.loss_mask[1:].sum()) for s in (a, b)}
    want = (3 * nll[a.episode_id] + nll[b.episode_id]) / (3 * n[a.episode_id] + n[b.episode_id])
    out = tr.step(copies)
    assert out["repeats_merged"] == 2.0 and out["trajectories"] == 4.0
    assert out["loss"] == pytest.approx(want, rel=1e-4)


def test_kl_fresh_checks_alignment_on_the_episodes_the_current_weights_sampled(ds_process, tiny_model):
    """`kl_fresh`: the behaviour/learner KL over the episodes every token of which the learner's current weights
    sampled (flags["lag"] == 0, set by the learner role). Float noise when the log-probs line up; large when they
    are off by one token; stale episodes (lag > 0) are left out of it, so their by-design drift cannot hide or
    fake a misalignment."""
    import numpy as np

    tr = _trainer(tiny_model, stage="ppo", off_policy="decoupled", zero_stage=1, advantage="floor")
    batch = _batch()
    for s in batch:
        with torch.no_grad():
            s.logprobs = tr._logp(collate([s]))[0][0].numpy().astype("float32") * s.loss_mask
    stale = batch[0]
    stale.logprobs = (stale.logprobs - 3.0 * stale.loss_mask).astype("float32")  # drifted far: a stale episode
    for s in batch:
        s.flags["lag"] = 1 if s is stale else 0
    tr.cfg.learner.ppo_epochs = 1
    out = tr.step(batch)
    assert out["fresh_trajectories"] == 3 and out["kl_fresh"] < 1e-4, out
    assert out["loss_mask_mismatch"] == 0, out  # the mask trained on is the turns' generated spans
    assert out["kl_behaviour"] > 0.1, out  # the stale episode's drift is in the batch-wide KL
    for s in batch[1:]:  # off by one token: each position gets its neighbour's log-prob
        s.logprobs = (np.roll(s.logprobs, 1) * s.loss_mask).astype("float32")
    out = tr.step(batch)
    assert out["kl_fresh"] > 0.05, out
