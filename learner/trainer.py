"""One optimisation step per stage (warmup / rft / critic / ppo) on DeepSpeed engines.

Every rank receives the same list of samples; micro-batches are packed by token
budget and dealt round-robin over ranks, padded with zero-weight micro-batches
so every rank runs the same number of forward/backward passes (ZeRO reduces
gradients during backward). Losses are token sums divided by the global token
count times the world size, since DeepSpeed averages gradients over ranks.
"""
from __future__ import annotations

import copy
import logging
import math
import time
from collections import defaultdict

import torch

from cluster.errors import DivergedError
from learner import engine as eng
from learner.data import (MicroBatch, Sample, collate, empty_like_batch, loss_mask_mismatch, merge_repeats,
                          pack)
from learner.models import Critic, load_critic, load_policy, token_logprobs
from learner.objective import (PPOParams, episode_baselines, gae, kl_to_reference, ppo_policy_loss, sft_loss,
                               value_loss)

log = logging.getLogger(__name__)

STAGES = ("warmup", "rft", "critic", "ppo")


class Trainer:
    def __init__(self, cfg, model_path: str) -> None:
        self.cfg = cfg
        lc = cfg.learner
        self.stage = lc.stage
        self.rank, self.world = eng.rank_world()
        self.device = eng.device()
        dtype = torch.bfloat16 if lc.dtype == "bf16" else torch.float32
        self.policy = eng.make_engine(load_policy(model_path, dtype), cfg, lc.actor_lr)
        self.critic = eng.make_engine(load_critic(lc.critic_model_path or model_path, dtype), cfg, lc.critic_lr)
        self.pad_id = int(getattr(self.policy.module.config, "pad_token_id", None) or 0)
        self.reference = None  # the policy as PPO began, frozen (learner.kl_ref_coef > 0)
        self.params = PPOParams(clip_low=lc.clip_low, clip_high=lc.clip_high, mode=lc.off_policy,
                                is_cap=lc.is_cap, mask_low=lc.is_mask_low, mask_high=lc.is_mask_high,
                                value_clip=lc.value_clip)

    def set_stage(self, stage: str, lr: float) -> None:
        """Switch the objective (and the policy's learning rate) between steps, keeping optimiser state."""
        if stage not in STAGES:
            raise ValueError(f"learner stage: unknown {stage!r} (known: {', '.join(STAGES)})")
        if stage != self.stage:
            log.info("stage %s -> %s (policy lr %g)", self.stage, stage, lr)
        self.stage = stage
        for group in self.policy.optimizer.param_groups:
            group["lr"] = lr

    # ---- data distribution -------------------------------------------------------------
    def _local_batches(self, samples: list[Sample]) -> tuple[list[MicroBatch], list[MicroBatch]]:
        """(this rank's micro-batches, padding micro-batches) with equal counts on every rank."""
        groups = pack(samples, self.cfg.learner.token_budget)
        mine = [collate(g, self.pad_id) for i, g in enumerate(groups) if i % self.world == self.rank]
        n = eng.all_reduce_max(len(mine))
        pads = [empty_like_batch(self.pad_id) for _ in range(n - len(mine))]
        return mine, pads

    def _global_tokens(self, batches: list[MicroBatch]) -> float:
        local = sum(float(b.loss_mask[:, 1:].sum()) for b in batches)
        return max(eng.all_reduce_sum([local])[0], 1.0)

    # ---- passes --------------------------------------------------------------------------
    def _logp(self, mb: MicroBatch, entropy: bool = False):
        return token_logprobs(self.policy, mb.input_ids, mb.attention_mask, want_entropy=entropy,
                              chunk=self.cfg.learner.logit_chunk, select=mb.loss_mask)

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        return self.critic(mb.input_ids, mb.attention_mask).float()

    @torch.no_grad()
    def _prepare(self, mb: MicroBatch, need_prox: bool, need_values: bool, baselines: dict | None = None,
                 need_ref: bool = False) -> dict:
        """Proximal log-probs, old values, advantages and returns of one micro-batch (no grad). ``baselines``
        (episode id -> leave-one-out mean reward): those episodes' advantages are reward - baseline on every
        generated token instead of GAE's; returns (the critic's targets) stay GAE's."""
        self.policy.eval()
        self.critic.eval()
        out: dict = {}
        if need_prox:
            out["logp_prox"] = self._logp(mb)[0].float()
        if self.reference is not None and need_ref:
            out["logp_ref"] = token_logprobs(self.reference, mb.input_ids, mb.attention_mask,
                                             chunk=self.cfg.learner.logit_chunk, select=mb.loss_mask)[0].float()
        if need_values:
            values = self._values(mb) * mb.loss_mask
            adv = torch.zeros_like(values)
            ret = torch.zeros_like(values)
            for i in range(values.shape[0]):
                a, r = gae(float(mb.reward[i]), values[i].cpu(), mb.loss_mask[i].cpu(),
                           self.cfg.learner.gamma, self.cfg.learner.lam)
                adv[i], ret[i] = a.to(values.device), r.to(values.device)
                base = (baselines or {}).get(mb.episode_ids[i]) if i < len(mb.episode_ids) else None
                if base is not None:
                    adv[i] = (float(mb.reward[i]) - base) * mb.loss_mask[i]
            out.update(old_values=values, adv=adv, returns=ret)
        return out

    def _whiten(self, prepared: list[dict], batches: list[MicroBatch]) -> None:
        s = sq = n = 0.0
        for p, b in zip(prepared, batches):
            m = b.loss_mask
            s += float((p["adv"] * m).sum())
            sq += float((p["adv"] ** 2 * m).sum())
            n += float(m.sum())
        s, sq, n = eng.all_reduce_sum([s, sq, n])
        if n <= 0:
            return
        mean = s / n
        std = max(sq / n - mean * mean, 0.0) ** 0.5
        for p, b in zip(prepared, batches):
            p["adv"] = (p["adv"] - mean) / (std + 1e-6) * b.loss_mask

    # ---- steps ---------------------------------------------------------------------------
    def step(self, samples: list[Sample]) -> dict:
        t0 = time.perf_counter()
        n_samples = len(samples)
        if self.stage == "rft":
            samples, counts = merge_repeats(samples)
        mine, pads = self._local_batches(samples)
        mismatch = float(sum(loss_mask_mismatch(b) for b in mine))  # summed over ranks with the tokens below
        batches = [b.to(self.device) for b in mine + pads]
        if self.stage == "rft":
            for b in batches[:len(mine)]:  # a row stands for its repeats: the loss and its normaliser count them
                for i, eid in enumerate(b.episode_ids):
                    b.loss_mask[i] *= counts.get(eid, 1)
            metrics = self._sft(batches)
            metrics["repeats_merged"] = float(sum(counts.values()) - len(counts))
        elif self.stage == "critic":
            metrics = self._ppo(batches, train_policy=False)
        else:
            self._snapshot_reference()
            fresh = {s.episode_id for s in samples if s.flags.get("lag") == 0}
            metrics = self._ppo(batches, train_policy=True, fresh=fresh,
                                baselines=episode_baselines(self.cfg.learner.advantage, samples))
        tokens, mismatch = eng.all_reduce_sum([float(sum(b.tokens for b in mine)), mismatch])
        if mismatch:
            log.warning("%d loss-mask position(s) disagree with the turns' generated spans (a learner bug: the "
                        "loss is not on the tokens the actor generated)", int(mismatch))
        metrics.update(tokens=tokens, trajectories=float(n_samples), step_s=time.perf_counter() - t0,
                       loss_mask_mismatch=mismatch)
        return metrics

    def _snapshot_reference(self) -> None:
        """At the first PPO step, a frozen copy of the policy for the KL penalty (learner.kl_ref_coef)."""
        if self.reference is not None or self.cfg.learner.kl_ref_coef <= 0:
            return
        self.reference = copy.deepcopy(self.policy.module).eval()
        for prm in self.reference.parameters():
            prm.requires_grad_(False)
        log.info("PPO's KL reference: the policy as of this step (kl_ref_coef %g)", self.cfg.learner.kl_ref_coef)

    def _sft(self, batches: list[MicroBatch]) -> dict:
        norm = self._global_tokens(batches) / self.world
        epochs = max(1, self.cfg.learner.rft_epochs)
        self.policy.train()
        acc = defaultdict(float)
        for epoch in range(epochs):
            for mb in batches:
                logp, ent = self._logp(mb, entropy=True)
                loss = sft_loss(logp, mb.loss_mask, normaliser=norm)
                self.policy.backward(loss, scale_wrt_gas=False)
                if epoch == epochs - 1:  # the metrics of the last pass
                    acc["loss"] += float(loss.detach()) / self.world
                    acc["entropy_sum"] += float((ent * mb.loss_mask).sum())
                    acc["n"] += float(mb.loss_mask.sum())
            self._step(self.policy, "policy")
        return self._finish(acc, ("entropy",))

    def _ppo(self, batches: list[MicroBatch], train_policy: bool, baselines: dict | None = None,
             fresh: set[str] = frozenset()) -> dict:
        """``fresh``: the episodes every token of which the learner's current weights sampled; the KL between
        their behaviour and recomputed log-probs (``kl_fresh``) is float noise unless the actor served other
        weights than the learner holds or the log-probs are misaligned (stale episodes drift by design)."""
        lc = self.cfg.learner
        need_prox = train_policy and self.params.mode != "none"
        prepared = [self._prepare(mb, need_prox, need_values=True, baselines=baselines, need_ref=train_policy)
                    for mb in batches]
        # The critic trains where its values make advantages (GAE; RLOO for a task alone in its step; the critic
        # stage); a PPO step whose advantages come from the rewards alone (reinforce, floor) skips its passes.
        train_critic = not (train_policy and lc.advantage in ("reinforce", "floor"))
        # whitening is GAE's: a leave-one-out baseline centres already, and reinforce's reward must keep its sign
        if lc.whiten_advantages and train_policy and not baselines:
            self._whiten(prepared, batches)
        norm = self._global_tokens(batches) / self.world
        acc = defaultdict(float)
        moved = [0.0, 0.0, 0.0, 0.0]  # sums of R*g, R, g, samples: see _reward_alignment
        for epoch in range(lc.ppo_epochs):
            self.policy.train()
            self.critic.train()
            for mb, prep in zip(batches, prepared):
                m = mb.loss_mask
                n_tok = float(m.sum())
                acc["n"] += n_tok
                if train_policy:
                    logp, ent = self._logp(mb, entropy=True)
                    prox = prep.get("logp_prox", logp.detach())  # mode none: KL stats vs current pi
                    loss, st = ppo_policy_loss(logp, prox, mb.logp_mu, prep["adv"], m, self.params, norm)
                    if "logp_ref" in prep:
                        kl_ref = kl_to_reference(logp, prep["logp_ref"], m, norm)
                        loss = loss + lc.kl_ref_coef * kl_ref
                        acc["kl_ref"] += float(kl_ref.detach()) / self.world
                    self.policy.backward(loss, scale_wrt_gas=False)
                    acc["policy_loss"] += float(loss.detach()) / self.world
                    acc["entropy_sum"] += float((ent * m).sum())
                    for k in ("clip_frac", "is_w_mean", "is_masked_frac", "kl_behaviour", "ratio_mean"):
                        acc[k + "_sum"] += float(st[k]) * n_tok
                    acc["is_w_max"] = max(acc["is_w_max"], float(st["is_w_max"]))
                    if epoch == 0 and fresh:
                        _add_fresh_kl(acc, prox, mb, fresh)
                    if epoch == lc.ppo_epochs - 1 and epoch > 0:
                        _add_movement(moved, logp.detach(), prep.get("logp_prox", mb.logp_mu), m, mb.reward)
                if train_critic:
                    values = self._values(mb)
                    vloss, vst = value_loss(values, prep["old_values"], prep["returns"], m, lc.value_clip, norm)
                    self.critic.backward(vloss, scale_wrt_gas=False)
                    acc["value_loss"] += float(vloss.detach()) / self.world
                    acc["value_err_sum"] += float(vst["value_err"]) * n_tok
                    acc["value_clip_frac_sum"] += float(vst["value_clip_frac"]) * n_tok
            if train_policy:
                self._step(self.policy, "policy")
            if train_critic:
                self._step(self.critic, "critic")
        for key in ("policy_loss", "value_loss"):
            acc[key] /= lc.ppo_epochs
        if "kl_ref" in acc:  # reported only where the penalty applies
            acc["kl_ref"] /= lc.ppo_epochs
        keys = ("entropy", "clip_frac", "is_w_mean", "is_masked_frac", "kl_behaviour", "ratio_mean") if train_policy else ()
        keys += ("value_err", "value_clip_frac") if train_critic else ()
        out = self._finish(acc, keys)
        if not train_critic:
            out.pop("value_loss", None)  # nothing trained it: no loss to report
        if train_policy:
            out["is_w_max"] = self._max(acc["is_w_max"])
            if lc.ppo_epochs > 1:
                out["reward_logp_cov"] = _reward_alignment(eng.all_reduce_sum(moved))
            kl_sum, n_fresh, rows = eng.all_reduce_sum([acc["kl_fresh_sum"], acc["n_fresh"], acc["fresh_rows"]])
            out["fresh_trajectories"] = rows
            if n_fresh > 0:
                out["kl_fresh"] = kl_sum / n_fresh
        return out

    @staticmethod
    def _step(engine, which: str) -> None:
        """The optimizer step, then its gradient norm checked: DeepSpeed skips a step whose norm is not finite in
        fp32, but in bf16 its overflow scan is off (engine.py), so such a step was applied and its weights are lost."""
        engine.step()
        norm = engine.get_global_grad_norm()
        if norm is None or math.isfinite(float(norm)):
            return
        if not engine.was_step_applied():
            log.warning("the %s's gradient norm is %s: DeepSpeed skipped this step", which, float(norm))
            return
        raise DivergedError(f"the {which}'s gradient norm is {float(norm)} and the step was applied: its weights are "
                            "not finite now and are neither published nor checkpointed. Set learner.deepspeed_json="
                            "'{\"bf16\": {\"check_grad_overflow\": true}}' to have DeepSpeed skip such steps")

    def _finish(self, acc: dict, mean_keys: tuple[str, ...]) -> dict:
        """Token-weighted means over all ranks; losses summed over ranks (each already a share)."""
        loss_keys = [k for k in ("loss", "policy_loss", "value_loss", "kl_ref") if k in acc]
        sums = eng.all_reduce_sum([acc["n"]] + [acc[k + "_sum"] for k in mean_keys] + [acc[k] for k in loss_keys])
        n = max(sums[0], 1.0)
        out = {k: sums[1 + i] / n for i, k in enumerate(mean_keys)}
        out.update({k: sums[1 + len(mean_keys) + i] for i, k in enumerate(loss_keys)})
        return out

    def _max(self, value: float) -> float:
        import torch.distributed as dist

        if not dist.is_initialized() or self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=eng.comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    # ---- evaluation helpers (tests, bench) ------------------------------------------------
    @torch.no_grad()
    def eval_loss(self, samples: list[Sample]) -> float:
        """The current stage's objective on the samples without updating (for tests of descent)."""
        batches = [collate(g, self.pad_id).to(self.device) for g in pack(samples, self.cfg.learner.token_budget)]
        self.policy.eval()
        self.critic.eval()
        total = 0.0
        n = sum(float(b.loss_mask.sum()) for b in batches)
        for mb in batches:
            if self.stage == "rft":
                total += float(sft_loss(self._logp(mb)[0], mb.loss_mask, normaliser=n))
            else:
                prep = self._prepare(mb, need_prox=False, need_values=True)
                total += float(value_loss(self._values(mb), prep["old_values"], prep["returns"],
                                          mb.loss_mask, 1e9, n)[0])
        return total

    def policy_module(self):
        return self.policy.module

    def critic_module(self) -> Critic:
        return self.critic.module


def _add_movement(moved: list[float], logp, base, mask, reward) -> None:
    """Accumulate, per sample, g = mean log-ratio (pi now / pi before this step's updates) of its tokens."""
    m = (mask > 0).to(logp.dtype)
    g = ((logp - base) * m).sum(1) / m.sum(1).clamp(min=1.0)
    real = m.sum(1) > 0  # padding micro-batches hold no sample
    r, g = reward[real].double(), g[real].double()
    for i, v in enumerate((float((r * g).sum()), float(r.sum()), float(g.sum()), float(real.sum()))):
        moved[i] += v


def _add_fresh_kl(acc: dict, prox, mb: MicroBatch, fresh: set[str]) -> None:
    """Accumulate the k3 KL(mu || pi) over the tokens of the micro-batch's fresh rows (see ``_ppo``)."""
    rows = torch.tensor([eid in fresh for eid in mb.episode_ids] + [False] * (mb.loss_mask.shape[0] - len(mb.episode_ids)),
                        device=mb.loss_mask.device)
    if not rows.any():
        return
    m = (mb.loss_mask > 0).to(prox.dtype) * rows[:, None].to(prox.dtype)
    d = prox.detach() - mb.logp_mu
    acc["kl_fresh_sum"] += float(((torch.exp(d) - 1.0 - d) * m).sum())
    acc["n_fresh"] += float(m.sum())
    acc["fresh_rows"] += float(rows.sum())


def _reward_alignment(sums: list[float]) -> float:
    """cov(reward, g) over the step's samples: > 0 when the update made the higher-reward samples more likely
    than the lower-reward ones. It is read off the oracle's rewards, not the advantages, so a sign error
    anywhere between reward and loss (GAE, whitening, the objective) turns it negative. Measured at the last
    of ppo_epochs passes (after the first ones' updates); 0 when every reward was the same."""
    rg, r, g, n = sums
    return (rg - r * g / n) / n if n > 0 else 0.0
