"""Trajectory factories shared by the learner tests."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from schemas.messages import Trajectory, TurnInfo


def make_traj(eid: str, n: int = 48, prompt: int = 12, version: int = 0, reward: float = 1.0, seed: int = 0,
              malformed: bool = False, repeated: bool = False, vocab: int = 1000, obs: tuple[int, int] | None = None,
              mode: str = "multi_turn") -> Trajectory:
    """A trajectory with `prompt` prompt tokens, generated tokens after, optionally an observation span."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(10, vocab, n).astype(np.int32)
    mask = np.zeros(n, np.uint8)
    mask[prompt:] = 1
    if obs:
        mask[obs[0]:obs[1]] = 0
    lp = np.where(mask > 0, rng.normal(-6.5, 0.3, n), 0).astype(np.float32)
    ver = np.where(mask > 0, version, -1).astype(np.int32)
    spans = [(0, prompt, obs[0]), (obs[0], obs[1], n)] if obs else [(0, prompt, n)]  # (start, gen_start, gen_end)
    turns = [TurnInfo(start=a, gen_start=g, gen_end=e, malformed_tool_call=malformed, repeated_action=repeated)
             for a, g, e in spans]
    return Trajectory(episode_id=eid, task_id=f"task-{eid}", actor_id="test", token_ids=ids, logprobs=lp,
                      loss_mask=mask, policy_version=ver, prompt_len=prompt, turns=turns, reward=reward,
                      mode=mode)


def wait_checkpoint(state: Path, min_step: int, proc, timeout: float = 150.0) -> None:
    """Until the learner's STATE.json says step >= min_step (the process ``proc`` must stay alive meanwhile)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"learner exited early with {proc.returncode}"
        try:
            if json.loads(state.read_text())["step"] >= min_step:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint at step >= {min_step} within {timeout}s")
