"""`actor.episode_mode = "by_stage"`: an episode's mode follows the stage of the learner's next step (warm-up is
single-turn, the other stages multi-turn), read from the newest weight version the actor applied."""
from __future__ import annotations

import types

from actors.actor import Actor
from actors.agent import EpisodeLimits
from cluster.config import episode_mode_at, load


def _cfg(mode: str, stages: str = "warmup:2,rft:1,ppo:3"):
    return load(None, [f"actor.episode_mode={mode}", f"learner.stages={stages}"])


def test_by_stage_is_single_turn_while_the_next_step_is_warmup():
    cfg = _cfg("by_stage")
    assert [episode_mode_at(cfg, n) for n in range(7)] == ["single_turn"] * 2 + ["multi_turn"] * 5
    assert episode_mode_at(_cfg("by_stage", "rft:1,ppo:1"), 0) == "multi_turn"
    assert {episode_mode_at(_cfg("single_turn"), n) for n in range(7)} == {"single_turn"}
    assert EpisodeLimits.from_config(cfg.actor).mode == "multi_turn"  # by_stage is resolved per episode


def test_the_actor_switches_mode_when_it_applies_a_version_past_the_warmup():
    cfg = _cfg("by_stage")
    actor = types.SimpleNamespace(cfg=cfg, limits=EpisodeLimits.from_config(cfg.actor), follower=None)
    assert Actor.limits_now(actor).mode == "single_turn"  # no version applied yet: step 0 is warm-up
    actor.follower = types.SimpleNamespace(learner_steps=1)
    assert Actor.limits_now(actor).mode == "single_turn"
    actor.follower.learner_steps = 2  # the version made by the last warm-up step: RFT comes next
    limits = Actor.limits_now(actor)
    assert limits.mode == "multi_turn" and limits.max_new_tokens == actor.limits.max_new_tokens
