"""Trajectories whose reward the infrastructure kept from being measured: skipped, counted, offsets consumed."""
from __future__ import annotations

import json
import math

from learner.ingest import Ingest
from schemas import topics
from schemas.messages import REWARD_UNDETERMINED

from .conftest import learner_cfg
from .helpers import make_traj


def undetermined(eid: str, **kw):
    t = make_traj(eid, **kw)
    t.reward, t.reward_status = math.nan, REWARD_UNDETERMINED
    t.evidence = {"undetermined": "the final evaluation failed (infrastructure)"}
    return t


def test_undetermined_skipped_counted_and_positions_consumed():
    ing = Ingest("ppo", max_staleness=4)
    order = [make_traj("a"), undetermined("u1"), make_traj("b", seed=1), undetermined("u2"), make_traj("c", seed=2)]
    for off, t in enumerate(order):
        ing.offer(t, 0, off)
    assert ing.ready() == 3
    assert [s.episode_id for s in ing.take(2, 0)] == ["a", "b"]
    assert ing.positions == {0: 4}  # u2, right behind the last taken sample, is consumed too
    assert ing.skipped_undetermined == 2 and ing.dropped == {"undetermined": 2}
    assert [s.episode_id for s in ing.take(2, 0)] == ["c"] and ing.positions == {0: 5}
    restored = Ingest.from_state("ppo", 4, ing.state())
    assert restored.skipped_undetermined == 2
    assert "u1" not in restored.seen  # skipped, not trained: a redelivery is skipped again, not deduplicated


def test_undetermined_never_reaches_rft_or_training_even_with_a_number_reward():
    ing = Ingest("rft", max_staleness=4)
    t = undetermined("u", reward=3.0)
    t.reward = 3.0  # whatever the number says, the status rules
    ing.offer(t, 0, 0)
    ing.offer(make_traj("g", reward=2.0), 0, 1)
    assert [s.episode_id for s in ing.take(4, 0)] == ["g"] and ing.dropped == {"undetermined": 1}


def test_nan_reward_without_the_status_is_invalid_not_trained():
    ing = Ingest("ppo", max_staleness=4)
    t = make_traj("x")
    t.reward = math.nan
    ing.offer(t, 0, 0)
    assert ing.take(4, 0) == [] and ing.dropped == {"invalid": 1} and ing.positions == {0: 1}


def test_learner_skips_undetermined_from_kafka_and_trains_the_rest(ds_process, tiny_model, make_cfg, tmp_path):
    """The learner role on the real broker: trains the determined episodes, skips and counts the others,
    and its checkpoint positions (and the group's offsets) cover the skipped records too."""
    from cluster import metrics
    from cluster.bus.client import Bus
    from cluster.bus.scan import committed_offsets, read_topic
    from cluster.launch.report import durable_invariants
    from learner.role import GROUP, LearnerRole

    cfg = learner_cfg(make_cfg(), stage="ppo", batch_trajectories=2, checkpoint_every=1, publish_every=1000,
                      checkpoint_dir=str(tmp_path / "ckpt"), model_path=tiny_model)
    bus = Bus(cfg, client_id="test-feeder")
    prod = bus.producer()
    order = [make_traj("g0", n=48, seed=0), undetermined("u0", n=48, seed=9), make_traj("g1", n=48, seed=1),
             undetermined("u1", n=48, seed=8), make_traj("g2", n=48, seed=2), make_traj("g3", n=48, seed=3)]
    for t in order:  # one partition: the order (and so which step skips what) is fixed
        prod.send(topics.TRAJECTORIES, t, key=t.task_id, partition=0).get(timeout=30)
    prod.close()

    before = metrics.REGISTRY.snapshot()["counters"].get("trajectories_skipped_undetermined", 0.0)
    role = LearnerRole(cfg, tiny_model, str(tmp_path / "ckpt"), bus=bus)
    try:
        assert role.run(max_steps=2, idle_wait_s=30) == 2
    finally:
        role.close()
    after = metrics.REGISTRY.snapshot()["counters"].get("trajectories_skipped_undetermined", 0.0)
    assert after - before == 2

    log = [r.msg for r in read_topic(bus, topics.LEARNER_LOG)]
    assert sorted(e for r in log for e in r.episode_ids) == ["g0", "g1", "g2", "g3"]
    assert max(r.metrics["trajectories_skipped_undetermined"] for r in log) == 2
    state = json.loads((tmp_path / "ckpt" / "STATE.json").read_text())
    assert state["ingest"]["positions"] == {"0": 6} and state["ingest"]["dropped"] == {"undetermined": 2}
    assert committed_offsets(bus, bus.group(GROUP), topics.TRAJECTORIES).get(0) == 6

    rep = durable_invariants(bus, bus.group("actors"))
    assert rep["trajectories_undetermined"] == 2 and rep["trajectories_skipped_undetermined"] == 2
    assert rep["reward_histogram"]["undetermined"] == 2 and sum(rep["reward_histogram"].values()) == 6
    assert rep["trajectories_trained"] == 4 and rep["trajectories_trained_twice"] == 0
    bus.close()
