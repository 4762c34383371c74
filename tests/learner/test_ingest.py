"""Ingestion logic: duplicates, staleness bound, stage filters, exactly-once positions, token packing."""
from __future__ import annotations

import dataclasses

import numpy as np

from learner.data import collate, from_trajectory, pack
from learner.ingest import Ingest

from .helpers import make_traj


def test_stale_trajectories_are_dropped_and_counted():
    ing = Ingest("ppo", max_staleness=2)
    for i, ver in enumerate([5, 3, 2, 4, 1]):  # learner at version 5: lags 0, 2, 3, 1, 4
        ing.offer(make_traj(f"e{i}", version=ver), partition=0, offset=i)
    got = ing.take(10, policy_version=5)
    assert [s.episode_id for s in got] == ["e0", "e1", "e3"]
    assert ing.dropped["stale"] == 2
    assert ing.drain_stale() == ["e2", "e4"]
    assert dict(ing.staleness) == {0: 1, 2: 1, 1: 1}
    assert ing.positions == {0: 5}


def test_duplicates_dropped_within_buffer_and_across_checkpoints():
    ing = Ingest("ppo", max_staleness=4)
    ing.offer(make_traj("a"), 0, 0)
    ing.offer(make_traj("a"), 1, 0)  # redelivered copy on another partition
    ing.offer(make_traj("b"), 0, 1)
    assert [s.episode_id for s in ing.take(5, 0)] == ["a", "b"]
    restored = Ingest.from_state("ppo", 4, ing.state())
    restored.offer(make_traj("a"), 1, 1)
    restored.offer(make_traj("c"), 1, 2)
    assert [s.episode_id for s in restored.take(5, 0)] == ["c"]
    assert restored.dropped["duplicate"] == 2  # one before the checkpoint, one after


def test_positions_cover_exactly_the_records_taken():
    ing = Ingest("ppo", max_staleness=4)
    for off in range(4):
        ing.offer(make_traj(f"p0-{off}"), 0, off)
        ing.offer(make_traj(f"p1-{off}"), 1, off)
    got = ing.take(3, 0)
    assert [s.episode_id for s in got] == ["p0-0", "p1-0", "p0-1"]
    assert ing.positions == {0: 2, 1: 1}  # p1-1 is still buffered: it must be read again after a restart
    # a record below a restored position is ignored (seek already passed it)
    again = Ingest.from_state("ppo", 4, ing.state())
    again.offer(make_traj("p0-1"), 0, 1)
    assert again.ready() == 0


def test_rft_keeps_only_clean_positive_trajectories():
    ing = Ingest("rft", max_staleness=4)
    ing.offer(make_traj("good", reward=2.0), 0, 0)
    ing.offer(make_traj("neg", reward=-1.0), 0, 1)
    ing.offer(make_traj("bad-call", reward=3.0, malformed=True), 0, 2)
    ing.offer(make_traj("loop", reward=3.0, repeated=True), 0, 3)
    assert [s.episode_id for s in ing.take(4, 0)] == ["good"]
    assert ing.dropped == {"rft_reward": 1, "rft_filtered": 2}
    assert ing.positions == {0: 4}


def test_warmup_trains_single_turn_episodes_only():
    ing = Ingest("warmup", max_staleness=4)
    ing.offer(make_traj("single", mode="single_turn"), 0, 0)
    ing.offer(make_traj("multi", mode="multi_turn"), 0, 1)
    assert [s.episode_id for s in ing.take(4, 0)] == ["single"]
    assert ing.dropped == {"warmup_multi_turn": 1}


def test_invalid_trajectory_dropped_with_its_offset_consumed():
    bad = make_traj("bad")
    bad.logprobs = bad.logprobs[:-1]
    ing = Ingest("ppo", max_staleness=4)
    ing.offer(bad, 0, 0)
    ing.offer(make_traj("ok"), 0, 1)
    assert [s.episode_id for s in ing.take(4, 0)] == ["ok"]
    assert ing.dropped["invalid"] == 1 and ing.positions == {0: 2}


def test_packing_by_token_budget_and_long_trajectory_alone():
    samples = [from_trajectory(make_traj(f"s{i}", n=n)) for i, n in enumerate([100, 300, 120, 200, 50])]
    long = from_trajectory(make_traj("long", n=131072, prompt=1000))
    groups = pack(samples + [long], token_budget=600)
    assert [s.episode_id for s in groups[0]] == ["long"]
    for g in groups:
        assert len(g) == 1 or len(g) * max(s.num_tokens for s in g) <= 600
    assert sorted(s.episode_id for g in groups for s in g) == sorted([f"s{i}" for i in range(5)] + ["long"])
    mb = collate(groups[1])
    assert mb.input_ids.shape[1] == max(s.num_tokens for s in groups[1])
    assert mb.attention_mask.sum().item() == sum(s.num_tokens for s in groups[1])


def test_observation_tokens_are_masked_in_samples():
    s = from_trajectory(make_traj("o", n=40, prompt=5, obs=(20, 30)))
    assert s.loss_mask[20:30].sum() == 0 and s.loss_mask[5:20].all() and s.loss_mask[30:].all()
    assert s.loss_mask[0] == 0
    assert np.all(s.logprobs[20:30] == 0)


def test_the_loss_mask_is_checked_against_the_turns_generated_spans():
    """`loss_mask_mismatch` (a learner metric each step; the learning test asserts 0): the mask trained on must
    cover exactly the spans the actor's turns record as generated. A mask one token late, which a learning curve
    does not show (docs/learning.md), counts at each span's two ends and at position 0."""
    from actors.trajectory import TrajectoryBuilder
    from learner.data import loss_mask_mismatch

    b = TrajectoryBuilder("m", "task", "actor")
    b.add_prompt(list(range(10, 17)))
    b.add_generation(list(range(20, 29)), [-0.5] * 9, [3] * 9)
    b.add_observation(list(range(30, 35)))
    b.add_generation(list(range(40, 46)), [-0.5] * 6, [3] * 6)
    good = from_trajectory(b.build(1.0, {}, "done"))
    assert loss_mask_mismatch(collate([good, from_trajectory(make_traj("o", n=40, prompt=5, obs=(20, 30)))])) == 0
    late = dataclasses.replace(good, episode_id="late", loss_mask=np.roll(good.loss_mask, 1))
    assert loss_mask_mismatch(collate([good, late])) == 4
    unrecorded = dataclasses.replace(late, generated=None)  # no turns recorded: nothing to check it against
    assert loss_mask_mismatch(collate([good, unrecorded])) == 0
