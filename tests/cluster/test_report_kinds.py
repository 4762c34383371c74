"""The run report reads the topics on the real broker: a record of the wrong kind on a topic (a dead letter,
a task on the trajectories topic) is not counted and does not crash the report."""
from __future__ import annotations

from schemas import topics
from schemas.messages import DeadLetter, Task
from tests.learner.helpers import make_traj


def test_report_ignores_records_of_another_kind(make_cfg):
    from cluster.bus.client import Bus
    from cluster.launch.report import durable_invariants

    cfg = make_cfg()
    bus = Bus(cfg, client_id="test-report")
    prod = bus.producer()
    stray = DeadLetter(source_topic="x", partition=0, offset=0, error="test", payload=b"\x00")
    for topic, msg in ((topics.TRAJECTORIES, make_traj("e0")), (topics.TRAJECTORIES, stray),
                       (topics.TRAJECTORIES, Task(task_id="t9", model_py="x = 1")), (topics.LEARNER_LOG, stray),
                       (topics.TOOL_REPLIES, stray), (topics.TASKS, stray), (topics.WEIGHTS, stray)):
        prod.send(topic, msg, key="k").get(timeout=30)
    prod.close()
    rep = durable_invariants(bus, bus.group("actors"))
    bus.close()
    assert rep["episodes_finished"] == 1 and rep["trajectory_messages"] == 1
    assert rep["learner_steps"] == 0 and rep["tool_calls_sent"] == 0 and rep["weight_versions_published"] == 0


def test_report_counts_duplicate_work_from_the_topics(make_cfg):
    """Work done twice is counted, not hidden: one task record rolled out by two episodes, one trajectory
    written twice (a producer retry), one tool request answered twice."""
    from cluster.bus.client import Bus
    from cluster.launch.report import durable_invariants
    from schemas.messages import CompileResult

    cfg = make_cfg()
    bus = Bus(cfg, client_id="test-report")
    prod = bus.producer()
    twice = [make_traj("e1"), make_traj("e2"), make_traj("e3")]
    for t in twice[:2]:  # the same task record (partition 0, offset 4) rolled out twice
        t.metadata.update(task_partition=0, task_offset=4)
    twice[2].metadata.update(task_partition=0, task_offset=5)
    for msg in (*twice, twice[2]):  # e3 written twice
        prod.send(topics.TRAJECTORIES, msg, key=msg.task_id).get(timeout=30)
    for rid in ("r1", "r1", "r2"):
        prod.send(topics.TOOL_REPLIES, CompileResult(request_id=rid, episode_id="e1", ok=True), key=rid).get(30)
    prod.close()
    rep = durable_invariants(bus, bus.group("actors"))
    bus.close()
    assert (rep["tasks_rolled_out_twice"], rep["trajectory_messages_duplicated"], rep["tool_calls_answered_twice"]) \
        == (1, 1, 1), rep


def test_the_tail_counts_the_final_versions_own_episodes_on_the_real_topics(make_cfg):
    """`cluster.tail_episodes` reads the topics: the final version is the last learner step's, and only its own
    episodes count (not demonstrations, not an older version's, not one a swap cut in two)."""
    import numpy as np

    from cluster.bus.client import Bus
    from cluster.launch.report import final_version_episodes
    from schemas.messages import TrainStep

    cfg = make_cfg()
    bus = Bus(cfg, client_id="test-tail")
    assert final_version_episodes(bus) == (-1, 0)  # no step yet
    prod = bus.producer()
    trajs = [make_traj(f"v2-{i}", version=2) for i in range(3)] + [make_traj("v1", version=1)]
    demo, cut = make_traj("demo", version=2), make_traj("cut", version=1)
    demo.metadata["demonstration"] = True
    ver = np.asarray(cut.policy_version).copy()
    ver[np.flatnonzero(ver >= 0)[-1]] = 2  # its last token sampled by version 2
    cut.policy_version = ver
    for t in (*trajs, demo, cut):
        prod.send(topics.TRAJECTORIES, t, key=t.task_id).get(timeout=30)
    for step, version in ((1, 1), (2, 2)):
        prod.send(topics.LEARNER_LOG, TrainStep(step=step, policy_version=version, stage="ppo", episode_ids=[]),
                  key="learner").get(30)
    prod.close()
    assert final_version_episodes(bus) == (2, 3)
    bus.close()
