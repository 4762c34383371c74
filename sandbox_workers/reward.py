"""The milestone reward (REFERENCE.md section 1): -1 fail, 1 correct, 2 beats eager, 3 beats both by > 5%."""
from __future__ import annotations

from schemas.messages import FAIL_REWARD


def faster(t: float, t0: float, threshold: float) -> bool:
    """b(t, t0): the candidate's time t beats t0 by more than `threshold` (relative)."""
    return t > 0 and t0 > 0 and (t0 - t) / t0 > threshold


def milestone_reward(compiled: bool, correct: bool, t: float | None, t_eager: float | None,
                     t_compile: float | None, threshold: float = 0.05) -> float:
    if not compiled or not correct:
        return FAIL_REWARD
    if t is None or t_eager is None:
        return 1.0
    beats_eager = faster(t, t_eager, threshold)
    beats_compile = t_compile is not None and faster(t, t_compile, threshold)
    if beats_eager and beats_compile:
        return 3.0
    if beats_eager:
        return 2.0
    return 1.0


def speedup(t: float | None, t0: float | None) -> float:
    return (t0 / t) if t and t0 and t > 0 else 0.0
