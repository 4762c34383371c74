"""Build a token-in-token-out trajectory incrementally, as the episode runs.

The stream is the concatenation of: the prompt tokens, then for each turn the
generated ids exactly as the engine produced them (loss mask 1, their
log-probs and policy versions), then the observation tokens (loss mask 0).
Generated text is never re-tokenized.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from schemas.messages import REWARD_OK, Trajectory, TurnInfo


@dataclass
class TrajectoryBuilder:
    episode_id: str
    task_id: str
    actor_id: str
    mode: str = "multi_turn"
    has_logprobs: bool = True
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[TurnInfo] = field(default_factory=list)
    prompt_len: int = 0
    _turn_start: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    def _extend(self, ids, logprobs, mask: int, versions) -> None:
        self.token_ids.extend(int(t) for t in ids)
        self.logprobs.extend(float(x) for x in logprobs)
        self.loss_mask.extend([mask] * len(ids))
        self.versions.extend(int(v) for v in versions)

    def add_prompt(self, ids: list[int]) -> None:
        if self.token_ids:
            raise ValueError("the prompt must come first")
        self._extend(ids, [0.0] * len(ids), 0, [-1] * len(ids))
        self.prompt_len = len(ids)
        self._turn_start = 0

    def add_generation(self, ids: list[int], logprobs: list[float], versions: list[int]) -> TurnInfo:
        """Append one assistant turn's generated tokens; returns its TurnInfo to annotate."""
        if not (len(ids) == len(logprobs) == len(versions)):
            raise ValueError(f"generation lengths differ: ids {len(ids)}, logprobs {len(logprobs)}, "
                             f"versions {len(versions)}")
        gen_start = len(self.token_ids)
        self._extend(ids, logprobs, 1, versions)
        turn = TurnInfo(start=self._turn_start, gen_start=gen_start, gen_end=len(self.token_ids))
        self.turns.append(turn)
        return turn

    def add_observation(self, ids: list[int]) -> None:
        """Tool output and chat-template glue: context for the model, never trained on."""
        self._turn_start = len(self.token_ids)
        self._extend(ids, [0.0] * len(ids), 0, [-1] * len(ids))

    def build(self, reward: float, evidence: dict[str, Any], end_reason: str,
              metadata: dict[str, Any] | None = None, reward_status: str = REWARD_OK) -> Trajectory:
        """The finished trajectory; ``reward_status`` "undetermined" marks a reward the infrastructure kept
        from being measured (the learner skips it)."""
        return Trajectory(
            episode_id=self.episode_id, task_id=self.task_id, actor_id=self.actor_id,
            token_ids=np.asarray(self.token_ids, dtype=np.int32),
            logprobs=np.asarray(self.logprobs, dtype=np.float32),
            loss_mask=np.asarray(self.loss_mask, dtype=np.uint8),
            policy_version=np.asarray(self.versions, dtype=np.int32),
            prompt_len=self.prompt_len, turns=list(self.turns), reward=float(reward),
            evidence=evidence, end_reason=end_reason, mode=self.mode,
            has_logprobs=self.has_logprobs, metadata=dict(metadata or {}), reward_status=reward_status,
        )
