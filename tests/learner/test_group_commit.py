"""The learner's group commit feeds the task feeder's gate on the trajectory backlog (its lag): one that fails (the
coordinator killed under it) is sent again while the learner waits for trajectories, or the gate could stay shut and
no episode would come. Pure logic, with a consumer that refuses the first commit (the real broker's side of a
resent commit: tests/backbone/test_bus.py::test_a_sync_commit_that_fails_is_sent_again_when_idle)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from kafka.errors import KafkaTimeoutError

from learner import role


def test_a_failed_group_commit_is_sent_again_while_the_learner_waits(monkeypatch):
    sent = []

    def commit(offsets, timeout_ms=None):
        sent.append({tp.partition: om.offset for tp, om in offsets.items()})
        if len(sent) == 1:
            raise KafkaTimeoutError("coordinator away")

    learner = object.__new__(role.LearnerRole)  # only what the group commit and the wait touch
    learner.consumer = SimpleNamespace(kafka=SimpleNamespace(commit=commit), poll=lambda timeout_s: time.sleep(0.01) or [])
    learner.bus = SimpleNamespace(topic=lambda t: f"run.{t}")
    learner.ingest = SimpleNamespace(positions={0: 5, 1: 7}, ready=lambda: 0)
    learner._group_commit_retry_at = None
    monkeypatch.setattr(role, "GROUP_COMMIT_RETRY_S", 0.05)
    learner._commit_group()
    assert sent == [{0: 5, 1: 7}] and learner._group_commit_retry_at is not None
    learner._fill(1, time.monotonic() + 0.5, threading.Event())
    assert sent == [{0: 5, 1: 7}] * 2 and learner._group_commit_retry_at is None
