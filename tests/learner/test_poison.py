"""Poisoned trajectories (token ids the model does not have): dropped before training, dead-lettered once with
the reason, the rest trained; the learner never crash-loops on them."""
from __future__ import annotations

import numpy as np

from learner.ingest import Ingest
from schemas import topics

from .conftest import learner_cfg
from .helpers import make_traj


def oov(eid: str, vocab: int, seed: int = 5):
    t = make_traj(eid, seed=seed)
    t.token_ids = t.token_ids.copy()
    t.token_ids[20] = vocab + 7
    return t


def test_ingest_rejects_out_of_vocabulary_ids_and_keeps_the_reason():
    ing = Ingest("ppo", max_staleness=4, vocab_size=1000)
    neg = make_traj("neg", seed=3)
    neg.token_ids = neg.token_ids.copy()
    neg.token_ids[5] = -1
    for off, t in enumerate([oov("bad", 1000), make_traj("good"), neg]):
        ing.offer(t, 0, off)
    assert [s.episode_id for s in ing.take(4, 0)] == ["good"] and ing.dropped == {"invalid": 2}
    assert ing.positions == {0: 3}
    assert [(p, o) for p, o, _ in ing.rejected] == [(0, 0), (0, 2)]
    assert "outside the model's vocabulary [0, 1000) (e.g. 1007)" in ing.rejected[0][2]
    unchecked = Ingest("ppo", max_staleness=4)  # vocab_size 0: no range check (pure data tests)
    unchecked.offer(oov("bad", 1000), 0, 0)
    assert unchecked.ready() == 1


def test_learner_dead_letters_poisoned_trajectories_once_and_trains_the_rest(ds_process, tiny_model, make_cfg,
                                                                              tmp_path):
    from cluster.bus.client import Bus
    from cluster.bus.scan import read_topic
    from learner.role import LearnerRole
    from schemas import codec

    cfg = learner_cfg(make_cfg(), stage="ppo", batch_trajectories=2, checkpoint_every=1, publish_every=1000,
                      checkpoint_dir=str(tmp_path / "ckpt"), model_path=tiny_model)
    role = LearnerRole(cfg, tiny_model, str(tmp_path / "ckpt"), bus=Bus(cfg, client_id="test-learner"))
    vocab = role.ingest.vocab_size
    assert vocab > 1000
    bus = Bus(cfg, client_id="test-feeder")
    prod = bus.producer()
    for t in (oov("p0", vocab), make_traj("g0"), oov("p1", vocab, seed=6), make_traj("g1", seed=1)):
        prod.send(topics.TRAJECTORIES, t, key=t.task_id, partition=0).get(timeout=30)
    prod.close()
    try:
        assert role.run(max_steps=1, idle_wait_s=30) == 1
    finally:
        role.close()
        role.bus.close()  # its dead-letter producer: left open, it asked for the deleted topics for the rest of the suite
    log = [r.msg for r in read_topic(bus, topics.LEARNER_LOG)]
    assert sorted(e for r in log for e in r.episode_ids) == ["g0", "g1"]
    letters = [r.msg for r in read_topic(bus, topics.DLQ)]
    full = bus.topic(topics.TRAJECTORIES)  # named as every other dead letter names its source
    assert sorted((x.source_topic, x.offset) for x in letters) == [(full, 0), (full, 2)]
    assert all("outside the model's vocabulary" in x.error and x.consumer == "learner" for x in letters)
    back = codec.decode(letters[0].payload)  # the record itself is kept, to be inspected or replayed
    assert back.episode_id == "p0" and int(np.max(back.token_ids)) == vocab + 7
    bus.close()
