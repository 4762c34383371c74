"""The learner's math: GAE, importance weights, PPO / value / SFT losses and their metrics.

Every tensor here is per token, already aligned: position t holds quantities of
token t (its log-prob under each policy, the critic's value of the state just
before it, its loss mask). Pure torch, no DeepSpeed: unit-testable by hand.

Off-policy modes (pi = policy being trained, pi_prox = the learner's own
recomputation before the update, mu = behaviour policy from the trajectory):

- ``none``:      r = pi / mu, w = 1 (plain PPO that treats the behaviour policy as old)
- ``tis``:       r = pi / pi_prox, w = min(pi_prox / mu, C)           (truncated IS)
- ``mask``:      r = pi / pi_prox, w = 1 if pi_prox / mu in [lo, hi] else 0   (icepop-style mask)
- ``decoupled``: r = pi / pi_prox, w = pi_prox / mu, zeroed outside [lo, hi]  (AReaL)

loss = -w * min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A), token mean.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from schemas.messages import FAIL_REWARD

MODES = ("none", "tis", "mask", "decoupled")


@dataclass
class PPOParams:
    clip_low: float = 0.2
    clip_high: float = 0.28
    mode: str = "decoupled"
    is_cap: float = 2.0
    mask_low: float = 0.5
    mask_high: float = 2.0
    value_clip: float = 0.2


def gae(reward: float, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns ([T]) of one sequence whose scalar reward lands on its last action token.

    Non-action tokens (prompt, tool observations: mask 0) are skipped: the next
    state of an action is the next action token, since the environment's tokens
    are not decisions. The bootstrap value after the last action is 0 (episode end).
    A plain reverse scan over Python floats: about 30 ms for 128k tokens.
    """
    vals = values.detach().to(torch.float64).cpu()
    idx = torch.nonzero(mask > 0, as_tuple=False).flatten()
    v = vals[idx].tolist()
    out = [0.0] * len(v)
    last_gae, next_value, r = 0.0, 0.0, float(reward)
    for k in range(len(v) - 1, -1, -1):
        delta = r + gamma * next_value - v[k]
        r = 0.0
        last_gae = delta + gamma * lam * last_gae
        out[k] = last_gae
        next_value = v[k]
    adv = torch.zeros_like(vals)
    adv[idx] = torch.tensor(out, dtype=torch.float64)
    returns = (adv + vals) * (mask > 0).cpu()
    return adv.to(values.dtype), returns.to(values.dtype)


def leave_one_out_baselines(samples) -> dict[str, float]:
    """Per episode id, the mean reward of the other episodes of its task among ``samples`` (objects with
    ``episode_id``, ``task_id`` and ``reward``); episodes alone for their task get none. With this baseline the
    advantages of one task's episodes sum to zero, so tokens that all its episodes share (the prompt's answer
    up to where they differ) get no net push, whichever way the batch's rewards fell; a critic that lags a
    rising pass rate instead pushes a rare failure's shared prefix down (docs/learning.md)."""
    by_task: dict[str, list] = {}
    for s in samples:
        by_task.setdefault(s.task_id, []).append(s)
    out = {}
    for group in by_task.values():
        if len(group) < 2:
            continue
        total = sum(float(s.reward) for s in group)
        for s in group:
            out[s.episode_id] = (total - float(s.reward)) / (len(group) - 1)
    return out


def importance_weights(logp_prox: torch.Tensor, logp_mu: torch.Tensor, p: PPOParams) -> torch.Tensor:
    """Per-token behaviour correction w (no grad), per the mode's rule above."""
    if p.mode == "none":
        return torch.ones_like(logp_prox)
    rho = torch.exp(logp_prox - logp_mu)
    if p.mode == "tis":
        return torch.clamp(rho, max=p.is_cap)
    inside = (rho >= p.mask_low) & (rho <= p.mask_high)
    if p.mode == "mask":
        return inside.to(rho.dtype)
    if p.mode == "decoupled":
        return torch.where(inside, rho, torch.zeros_like(rho))
    raise ValueError(f"learner.off_policy: unknown mode {p.mode!r} (known: {', '.join(MODES)})")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def ppo_policy_loss(logp: torch.Tensor, logp_prox: torch.Tensor, logp_mu: torch.Tensor, adv: torch.Tensor,
                    mask: torch.Tensor, p: PPOParams, normaliser: float | None = None
                    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped PPO loss summed over masked tokens, divided by ``normaliser`` (default: masked count)."""
    m = (mask > 0).to(logp.dtype)
    old = logp_mu if p.mode == "none" else logp_prox
    ratio = torch.exp(logp - old.detach())
    w = importance_weights(logp_prox.detach(), logp_mu, p).detach()
    clipped = torch.clamp(ratio, 1.0 - p.clip_low, 1.0 + p.clip_high)
    per_tok = -w * torch.minimum(ratio * adv, clipped * adv)
    denom = float(m.sum().clamp(min=1.0)) if normaliser is None else normaliser
    loss = (per_tok * m).sum() / denom
    with torch.no_grad():
        n = m.sum().clamp(min=1.0)
        clip_hit = ((ratio < 1.0 - p.clip_low) & (adv < 0)) | ((ratio > 1.0 + p.clip_high) & (adv > 0))
        rho = torch.exp(logp_prox - logp_mu)
        stats = {
            "clip_frac": (clip_hit.to(m.dtype) * m).sum() / n,
            "is_w_mean": (w * m).sum() / n,
            "is_w_max": (w * m).max() if m.any() else torch.zeros(()),
            "is_masked_frac": ((w == 0).to(m.dtype) * m).sum() / n,
            # k3 estimator of KL(mu || pi_prox) on the behaviour samples.
            "kl_behaviour": ((rho - 1.0 - (logp_prox - logp_mu)) * m).sum() / n,
            "ratio_mean": (ratio.detach() * m).sum() / n,
            "tokens": m.sum(),
        }
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float, normaliser: float | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2), token sum / normaliser."""
    m = (mask > 0).to(values.dtype)
    v_clipped = old_values + torch.clamp(values - old_values, -clip, clip)
    per_tok = 0.5 * torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
    denom = float(m.sum().clamp(min=1.0)) if normaliser is None else normaliser
    loss = (per_tok * m).sum() / denom
    with torch.no_grad():
        n = m.sum().clamp(min=1.0)
        stats = {"value_err": ((values - returns).abs() * m).sum() / n,
                 "value_clip_frac": (((values - old_values).abs() > clip).to(m.dtype) * m).sum() / n}
    return loss, stats


def sft_loss(logp: torch.Tensor, mask: torch.Tensor, normaliser: float | None = None) -> torch.Tensor:
    """Negative log-likelihood of the generated tokens (rejection fine-tuning); a mask value above 1 weights its
    token (a row standing for repeated demonstrations, learner.data.merge_repeats)."""
    m = mask.to(logp.dtype)
    denom = float(m.sum().clamp(min=1.0)) if normaliser is None else normaliser
    return -(logp * m).sum() / denom


def whiten(adv: torch.Tensor, mask: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Normalise advantages over the masked tokens (mean 0, std 1), zero elsewhere."""
    m = (mask > 0).to(adv.dtype)
    n = m.sum().clamp(min=1.0)
    mean = (adv * m).sum() / n
    var = (((adv - mean) ** 2) * m).sum() / n
    return (adv - mean) * torch.rsqrt(var + eps) * m


def episode_baselines(kind: str, samples) -> dict[str, float]:
    """Per episode id, the baseline its reward is taken against on every generated token (learner.advantage):
    "rloo" the leave-one-out mean, "reinforce" none (0: the reward itself, and nothing recentres it, since the
    trainer whitens only GAE's advantages), "floor" the failure reward (a failed episode's advantage is 0 and a
    passing one is pushed up by its margin above failure: REINFORCE with a constant baseline, so the same policy
    gradient in expectation, but no unlikelihood push on a failure's garbage tail), "gae" {} (the critic's GAE
    for every episode)."""
    if kind == "rloo":
        return leave_one_out_baselines(samples)
    if kind == "reinforce":
        return {s.episode_id: 0.0 for s in samples}
    if kind == "floor":
        return {s.episode_id: FAIL_REWARD for s in samples}
    return {}


def kl_to_reference(logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, normaliser: float) -> torch.Tensor:
    """k3 estimate of KL(pi || pi_ref) on the sampled tokens, summed over masked tokens / normaliser: exp(d) - d - 1
    with d = logp_ref - logp, never negative, zero where pi = pi_ref, its gradient pulling logp toward logp_ref."""
    d = logp_ref.detach() - logp
    m = (mask > 0).to(logp.dtype)
    return ((torch.exp(d) - d - 1.0) * m).sum() / max(normaliser, 1.0)
