"""Training samples from trajectories: validation, stage filters, token-budget packing, collation.

A ``Sample`` is one trajectory reduced to what training needs, with the Kafka
position it came from. ``pack`` groups samples into micro-batches whose padded
size (rows x longest row) stays within the token budget; a trajectory longer
than the budget (a 128k-token episode) gets a micro-batch of its own and is
never split, since its attention needs the whole context.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


class InvalidTrajectory(ValueError):
    """The trajectory's arrays disagree or it has nothing to train on."""

    retriable = False


@dataclass
class Sample:
    episode_id: str
    token_ids: np.ndarray  # int32 [T]
    logprobs: np.ndarray  # float32 [T] behaviour log-probs
    loss_mask: np.ndarray  # uint8 [T]
    reward: float
    min_version: int  # oldest policy version among generated tokens
    partition: int = -1
    offset: int = -1
    flags: dict = field(default_factory=dict)
    task_id: str = ""  # the leave-one-out baseline (learner.advantage = "rloo") groups samples by task
    # uint8 [T]: 1 on the spans the trajectory's turns record as generated (None: it records no turns). A second
    # account of what the engine wrote, kept apart from loss_mask so the learner can check the one it trains on
    generated: np.ndarray | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


def from_trajectory(traj, partition: int = -1, offset: int = -1, vocab_size: int = 0) -> Sample:
    """Validate a schemas.Trajectory and turn it into a Sample (raises InvalidTrajectory).

    ``vocab_size`` > 0: every token id must be one the model has (an id out of range would crash the
    embedding lookup, and the learner would crash-loop on the same record)."""
    n = traj.num_tokens
    for name in ("logprobs", "loss_mask", "policy_version"):
        arr = getattr(traj, name)
        if arr.shape != (n,):
            raise InvalidTrajectory(f"episode {traj.episode_id}: {name} has shape {arr.shape}, token_ids ({n},)")
    if n < 2:
        raise InvalidTrajectory(f"episode {traj.episode_id}: {n} tokens")
    ids = np.asarray(traj.token_ids)
    if vocab_size > 0 and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)]
        raise InvalidTrajectory(f"episode {traj.episode_id}: {bad.size} token ids outside the model's vocabulary "
                                f"[0, {vocab_size}) (e.g. {int(bad[0])})")
    if not np.isfinite(traj.reward):  # an undetermined reward is skipped before; never train on one
        raise InvalidTrajectory(f"episode {traj.episode_id}: reward {traj.reward!r} is not a number")
    mask = np.asarray(traj.loss_mask, dtype=np.uint8).copy()
    mask[0] = 0  # the first token has no context to be predicted from
    if not mask.any():
        raise InvalidTrajectory(f"episode {traj.episode_id}: no generated tokens")
    gen_versions = traj.policy_version[mask > 0]
    flags = {
        "malformed": any(t.malformed_tool_call for t in traj.turns),
        "repeated": any(t.repeated_action for t in traj.turns),
        "has_logprobs": bool(traj.has_logprobs),
        "mode": traj.mode,
        # an episode of a held-out task (`kernelrl bench learning`): its pass rate is measured, never trained on
        "heldout": bool((traj.metadata or {}).get("heldout")),
    }
    return Sample(episode_id=traj.episode_id, token_ids=np.asarray(traj.token_ids, dtype=np.int64),
                  logprobs=np.array(traj.logprobs, dtype=np.float32), loss_mask=mask,
                  reward=float(traj.reward), min_version=int(gen_versions.min()), partition=partition,
                  offset=offset, flags=flags, task_id=str(traj.task_id or ""), generated=generated_spans(traj))


def generated_spans(traj) -> np.ndarray | None:
    """1 where a turn of ``traj`` says its engine generated the token, 0 elsewhere (None: no turns recorded)."""
    if not traj.turns:
        return None
    n = traj.num_tokens
    out = np.zeros(n, np.uint8)
    for t in traj.turns:
        out[max(int(t.gen_start), 0):min(int(t.gen_end), n)] = 1
    out[0] = 0  # never a target (see from_trajectory)
    return out


def stage_rejects(sample: Sample, stage: str) -> str:
    """Why a stage does not train on this sample ('' = it does)."""
    if sample.flags.get("heldout"):
        return "heldout"  # no stage trains on a held-out task's episode
    if stage == "rft":
        if sample.reward <= 0:
            return "rft_reward"
        if sample.flags.get("malformed") or sample.flags.get("repeated"):
            return "rft_filtered"
    if stage in ("ppo", "warmup") and not sample.flags.get("has_logprobs", True):
        return "no_logprobs"
    if stage == "warmup" and sample.flags.get("mode") != "single_turn":
        return "warmup_multi_turn"  # the warm-up stage is single-turn PPO
    return ""


def pack(samples: list[Sample], token_budget: int) -> list[list[Sample]]:
    """Greedy length-sorted packing: each micro-batch has rows * max_len <= token_budget."""
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    cur_max = 0
    for s in sorted(samples, key=lambda s: s.num_tokens, reverse=True):
        new_max = max(cur_max, s.num_tokens)
        if cur and new_max * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur, new_max = [], s.num_tokens
        cur.append(s)
        cur_max = new_max
    if cur:
        out.append(cur)
    return out


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T] float (targets that count)
    logp_mu: torch.Tensor  # [B, T] behaviour log-probs of token t
    reward: torch.Tensor  # [B]
    episode_ids: list[str]
    generated: torch.Tensor | None = None  # [B, T] int8: Sample.generated, -1 on rows without it

    def to(self, device) -> "MicroBatch":
        gen = None if self.generated is None else self.generated.to(device)
        return MicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device),
                          self.logp_mu.to(device), self.reward.to(device), self.episode_ids, gen)

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def merge_repeats(samples: list[Sample]) -> tuple[list[Sample], dict[str, int]]:
    """(the samples with identical token sequences and loss masks kept once, episode id -> how many it stands
    for). A demonstration replayed N times is one sequence: trained once with weight N, RFT's gradient is the
    same at 1/N of the compute."""
    first: dict[tuple[bytes, bytes], Sample] = {}
    counts: dict[str, int] = {}
    for s in samples:
        key = (s.token_ids.tobytes(), s.loss_mask.tobytes())
        keep = first.setdefault(key, s)
        counts[keep.episode_id] = counts.get(keep.episode_id, 0) + 1
    return list(first.values()), counts


def collate(samples: list[Sample], pad_id: int = 0) -> MicroBatch:
    """Right-padded [B, T] tensors; padding has attention 0 and loss mask 0."""
    T = max(s.num_tokens for s in samples)
    B = len(samples)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    lm = torch.zeros((B, T), dtype=torch.float32)
    lp = torch.zeros((B, T), dtype=torch.float32)
    gen = torch.zeros((B, T), dtype=torch.int8)
    for i, s in enumerate(samples):
        n = s.num_tokens
        ids[i, :n] = torch.from_numpy(s.token_ids)
        att[i, :n] = 1
        lm[i, :n] = torch.from_numpy(s.loss_mask.astype(np.float32))
        lp[i, :n] = torch.from_numpy(s.logprobs)
        if s.generated is None:
            gen[i] = -1
        else:
            gen[i, :n] = torch.from_numpy(s.generated.astype(np.int8))
    reward = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    return MicroBatch(ids, att, lm, lp, reward, [s.episode_id for s in samples], gen)


def loss_mask_mismatch(mb: MicroBatch) -> int:
    """Positions where the loss mask the learner trains on disagrees with the turns' record of what the engine
    generated (a target that is prompt or tool output, or a generated token left out), over the rows that carry
    that record. 0 unless the mask was misbuilt or misaligned between the trajectory and the loss: a mask one
    token late changes the pass rate too little for a learning curve to show (docs/learning.md)."""
    if mb.generated is None:
        return 0
    known = mb.generated >= 0
    return int((((mb.loss_mask > 0) != (mb.generated > 0)) & known).sum())


def empty_like_batch(pad_id: int = 0) -> MicroBatch:
    """A one-token, zero-weight micro-batch: keeps ranks' collective calls in step when one has no data."""
    z = torch.zeros((1, 2), dtype=torch.float32)
    return MicroBatch(torch.full((1, 2), pad_id, dtype=torch.long), torch.ones((1, 2), dtype=torch.long),
                      z.clone(), z.clone(), torch.zeros(1), [])
