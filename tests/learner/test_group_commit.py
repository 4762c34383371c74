"""The learner's group commit feeds the task feeder's gate on the trajectory backlog (its lag): one that fails (the
coordinator killed under it) is kept by the bus consumer and sent again while the learner waits for trajectories,
or the gate could stay shut and no episode would come. On the real broker, with the learner's own kind of consumer
(its partitions assigned, positions committed for the group); the failure injected: one commit that times out."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from kafka.errors import KafkaTimeoutError

from learner import role
from schemas import topics


def test_a_failed_group_commit_is_sent_again_while_the_learner_waits(make_cfg, monkeypatch):
    from cluster.bus.client import Bus
    from cluster.bus.scan import committed_offsets

    bus = Bus(make_cfg(), client_id="group-commit")
    learner = object.__new__(role.LearnerRole)  # only what the group commit and the wait touch
    learner.bus = bus
    learner.ingest = SimpleNamespace(positions={0: 5, 1: 7}, ready=lambda: 0)
    learner.consumer = bus.consumer([topics.TRAJECTORIES], bus.group(role.GROUP),
                                    assign=[(topics.TRAJECTORIES, p) for p in (0, 1)])
    real_commit = learner.consumer.kafka.commit
    calls = []

    def commit_once_refused(offsets, timeout_ms=None):
        calls.append(timeout_ms)
        if len(calls) == 1:
            raise KafkaTimeoutError("coordinator away")
        return real_commit(offsets, timeout_ms=timeout_ms)

    monkeypatch.setattr(learner.consumer.kafka, "commit", commit_once_refused)
    learner._commit_group()  # logged, never raised: a step does not fail for it
    assert committed_offsets(bus, bus.group(role.GROUP), topics.TRAJECTORIES) == {0: 0, 1: 0}  # none yet
    learner._fill(1, time.monotonic() + 3.0, threading.Event())  # waiting for trajectories: idle polls resend it
    assert committed_offsets(bus, bus.group(role.GROUP), topics.TRAJECTORIES) == {0: 5, 1: 7}
    assert calls[0] == role.GROUP_COMMIT_TIMEOUT_MS and len(calls) >= 2
    learner.consumer.close()
    bus.close()
