"""The bus against the real embedded broker: round trips, big messages, DLQ, consumer groups."""
from __future__ import annotations

import threading
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.bus.client import Bus, MessageTooLarge
from schemas import codec
from schemas import topics as T
from schemas.messages import DeadLetter, Task
from tests.backbone.samples import all_samples, assert_same, big_trajectory


def drain(consumer, want: int, timeout_s: float = 30.0, commit: bool = True) -> list:
    """Poll until ``want`` records arrived (or fail after timeout)."""
    got, deadline = [], time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for rec in consumer.poll(timeout_s=0.2):
            got.append(rec)
            if commit:
                consumer.commit(rec)
    assert len(got) >= want, f"got {len(got)} of {want} records in {timeout_s}s"
    return got


def dead_letters(bus, n: int, timeout_s: float = 30.0) -> list[DeadLetter]:
    c = bus.consumer([T.DLQ], group_id=f"dlq-reader-{time.monotonic_ns()}", expected=DeadLetter)
    try:
        return [r.msg for r in drain(c, n, timeout_s)]
    finally:
        c.close()


def test_every_message_type_round_trips_through_kafka(cfg):
    samples = all_samples()
    with Bus(cfg, client_id="rt") as bus:
        prod = bus.producer()
        for kind, msg in samples.items():
            prod.send(T.TASKS, msg, key=kind)
        prod.flush(30)
        cons = bus.consumer([T.TASKS], group_id="rt")
        got = drain(cons, len(samples))
        cons.close()
        prod.close()
    assert {r.key for r in got} == set(samples)
    for rec in got:
        assert rec.topic == T.TASKS and rec.raw_topic == cfg.topic(T.TASKS) and rec.timestamp_ms > 0
        assert_same(samples[rec.key], rec.msg)


def test_4mb_trajectory_through_kafka(cfg):
    traj = big_trajectory(330_000, seed=4)
    size = len(codec.encode(traj))
    assert size > 4 * 1024 * 1024
    with Bus(cfg, client_id="big") as bus:
        prod = bus.producer()
        meta = prod.send(T.TRAJECTORIES, traj, key=traj.task_id).get(60)
        assert meta.offset == 0
        cons = bus.consumer([T.TRAJECTORIES], group_id="learner")
        (rec,) = drain(cons, 1)
        cons.close()
        prod.close()
    assert_same(traj, rec.msg)


def test_oversized_message_is_refused_before_sending(make_cfg):
    cfg = make_cfg(create_topics=False)
    cfg.bus.max_message_bytes = 1024 * 1024
    with Bus(cfg) as bus:
        prod = bus.producer()
        with pytest.raises(MessageTooLarge, match="exceeds bus.max_message_bytes=1048576"):
            prod.send(T.TRAJECTORIES, big_trajectory(100_000))
        prod.close()


def test_invalid_message_goes_to_dlq_and_consumer_continues(cfg):
    with Bus(cfg, client_id="dlq") as bus:
        prod = bus.producer()
        prod.send(T.TASKS, Task(task_id="a", model_py="m"), key="k", partition=0)
        prod.send_bytes(T.TASKS, b"\x93not msgpack at all", key="k", partition=0)
        prod.send_bytes(T.TASKS, msgpack.packb({"k": "task", "v": 1, "d": {"task_id": 7, "model_py": "m"}}), key="k", partition=0)
        prod.send(T.TASKS, big_trajectory(10), key="k", partition=0)  # valid, but not what this consumer takes
        prod.send(T.TASKS, Task(task_id="b", model_py="m"), key="k", partition=0)
        prod.flush(30)
        cons = bus.consumer([T.TASKS], group_id="workers", expected=Task)
        got = drain(cons, 2)
        assert [r.msg.task_id for r in got] == ["a", "b"] and cons.stats["dead_lettered"] == 3
        cons.close()
        letters = sorted(dead_letters(bus, 3), key=lambda d: d.offset)
        prod.close()
        lag = bus.lag("workers", [T.TASKS])
    assert [d.offset for d in letters] == [1, 2, 3]
    assert all(d.source_topic == cfg.topic(T.TASKS) and d.partition == 0 for d in letters)
    assert letters[0].payload == b"\x93not msgpack at all" and "undecodable" in letters[0].error
    assert "task.task_id: expected str, got int" in letters[1].error
    assert "unexpected message kind 'trajectory'" in letters[2].error
    assert lag == {T.TASKS: 0}  # dead-lettered offsets are committed along with the good ones


def test_fuzzed_bytes_never_crash_a_consumer_and_land_in_the_dlq(cfg):
    bus = Bus(cfg, client_id="fuzz")
    prod = bus.producer()
    cons = bus.consumer([T.TASKS], group_id="fuzz")
    dlq = bus.consumer([T.DLQ], group_id="fuzz-dlq", expected=DeadLetter)
    seen_letters: list[DeadLetter] = []
    valid = codec.encode(Task(task_id="ok", model_py="m"))

    @settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(st.binary(max_size=300),
                              st.binary(min_size=1, max_size=40).map(lambda b: valid[: len(b)] + b)),
                    min_size=1, max_size=25))
    def check(payloads):
        bad = []
        for p in payloads:
            try:
                codec.decode(p)
            except codec.SchemaError:
                bad.append(p)
            prod.send_bytes(T.TASKS, p, partition=0)
        prod.send(T.TASKS, Task(task_id="sentinel", model_py="m"), partition=0)
        prod.flush(30)
        good = drain(cons, len(payloads) - len(bad) + 1)
        assert good[-1].msg.task_id == "sentinel"
        letters = [r.msg for r in drain(dlq, len(bad))]
        seen_letters.extend(letters)
        assert sorted(d.payload for d in letters) == sorted(bad)

    try:
        check()
    finally:
        cons.close()
        dlq.close()
        prod.close()
        bus.close()
    assert seen_letters and all(d.source_topic == cfg.topic(T.TASKS) and d.error for d in seen_letters)


def _wait(pred, timeout_s=30.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class _Owner(threading.Thread):
    """A member of group ``group`` polling on its own thread as serve() does (idle: resend and reassert its
    commits); ``commit_each`` commits every record it gets; ``call(fn)`` runs fn(consumer) on its thread."""

    def __init__(self, bus, name: str, group: str, commit_each: bool):
        super().__init__(daemon=True, name=name)
        self.consumer = bus.consumer([T.TASKS], group_id=group, client_id=name)
        self.records, self.assigned, self.commit_each = [], set(), commit_each
        self.stop, self._todo = threading.Event(), []

    def call(self, fn, timeout_s: float = 30.0):
        box: list = []
        self._todo.append((fn, box))
        _wait(lambda: bool(box), timeout_s=timeout_s, what=f"{self.name} to run a call")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def run(self):
        while not self.stop.is_set():
            got = self.consumer.poll(timeout_s=0.1)
            for rec in got:
                self.records.append(rec)
                if self.commit_each:
                    self.consumer.commit(rec)
            if not got:
                self.consumer.recommit_failed()
            self.assigned = self.consumer.assignment()
            while self._todo:
                fn, box = self._todo.pop(0)
                try:
                    box.append(fn(self.consumer))
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    box.append(exc)
        self.consumer.close()


def test_group_of_two_splits_partitions_and_rebalances_when_one_leaves(make_cfg):
    cfg = make_cfg(topics__partitions=4)
    bus = Bus(cfg, client_id="grp")
    a, b = _Owner(bus, "a", "split", True), _Owner(bus, "b", "split", True)
    a.start()
    _wait(lambda: len(a.assigned) == 4, what="a owning all 4 partitions")
    b.start()
    _wait(lambda: len(a.assigned) == 2 and len(b.assigned) == 2, what="a 2/2 split")
    assert a.assigned.isdisjoint(b.assigned)
    prod = bus.producer()
    for i in range(40):
        prod.send(T.TASKS, Task(task_id=f"t{i}", model_py="m"), key=f"key-{i}")
    prod.flush(30)
    _wait(lambda: len(a.records) + len(b.records) >= 40, what="40 records")
    assert a.records and b.records
    assert {r.partition for r in a.records}.isdisjoint({r.partition for r in b.records})
    b.stop.set()
    b.join(10)
    _wait(lambda: len(a.assigned) == 4, what="a taking over b's partitions")
    for i in range(40, 60):
        prod.send(T.TASKS, Task(task_id=f"t{i}", model_py="m"), key=f"key-{i}")
    prod.flush(30)
    _wait(lambda: len({r.msg.task_id for r in a.records + b.records}) >= 60, what="all 60 tasks")
    a.stop.set()
    a.join(10)
    prod.close()
    ids = [r.msg.task_id for r in a.records + b.records]
    assert set(ids) == {f"t{i}" for i in range(60)}
    assert len(ids) == 60  # clean hand-over: committed work is not redelivered
    assert bus.lag("split", [T.TASKS]) == {T.TASKS: 0}
    bus.close()



def _refuse_async(kafka):
    from kafka.errors import CommitFailedError

    return "commit_async", lambda offsets, callback: callback(offsets, CommitFailedError("rebalance in progress"))


def _refuse_sync(error):
    def patch(kafka):
        def commit(offsets=None, timeout_ms=None):
            raise error("the group is rebalancing")
        return "commit", commit
    return patch


@pytest.mark.parametrize("refuse", ["async", "sync-rebalancing", "sync-commit-failed"])
def test_a_commit_refused_by_a_rebalance_is_sent_again_when_the_partition_stays(refuse, make_cfg, monkeypatch):
    """kafka-python 3 keeps a partition's fetch position when a rebalance gives it straight back, so a record
    whose commit the rebalance refused is never redelivered: the consumer must send that commit again itself
    (seen as a worker's last request staying uncommitted for a minute). Member A handles one record per partition;
    its commit is refused: async, or sync (RebalanceInProgressError used to escape as a BusError and end the
    worker). The refusal is injected at the client: the broker refuses only inside the rebalance's own
    JoinGroup/SyncGroup window, which a test cannot hit on purpose. B joins, A keeps one partition and its
    commit lands, and B is served the other partition's record again."""
    from cluster.bus.scan import committed_offsets

    cfg = make_cfg(topics__partitions=2)
    bus = Bus(cfg, client_id="rejoin")
    prod = bus.producer()
    for p in (0, 1):
        prod.send(T.TASKS, Task(task_id=f"t{p}", model_py="m"), key="k", partition=p).get(10)
    prod.close()
    a = bus.consumer([T.TASKS], group_id="rejoin", client_id="a")
    got = []
    _wait(lambda: got.extend(a.poll(timeout_s=0.2)) or len(got) == 2, what="a's two records")
    from kafka.errors import CommitFailedError, RebalanceInProgressError

    patch = {"async": _refuse_async, "sync-rebalancing": _refuse_sync(RebalanceInProgressError),
             "sync-commit-failed": _refuse_sync(CommitFailedError)}[refuse]
    monkeypatch.setattr(a.kafka, *patch(a.kafka))
    assert a.commit(sync=refuse != "async") is (refuse == "async")  # a refused sync commit says so; no exception
    monkeypatch.undo()
    b = _Owner(bus, "b", "split", True)
    b.consumer.close()
    b.consumer = bus.consumer([T.TASKS], group_id="rejoin", client_id="b")
    b.start()
    redelivered = []

    def a_polls(resend: bool) -> bool:
        redelivered.extend(a.poll(timeout_s=0.2))
        if resend:
            a.recommit_failed()  # what serve() does on an idle poll (not before the split: that would be too easy)
        return len(a.assignment()) == 1 and len(b.assigned) == 1

    _wait(lambda: a_polls(False), what="a 1/1 split")
    (_, kept), = a.assignment()
    assert not [r for r in redelivered if r.partition == kept], "the kept partition's position was reset"
    assert committed_offsets(bus, bus.group("rejoin"), T.TASKS).get(kept) == 0
    _wait(lambda: a_polls(True) and committed_offsets(bus, bus.group("rejoin"), T.TASKS).get(kept) == 1,
          what=f"the kept partition {kept}'s commit")
    _wait(lambda: b.records, what="b served the moved partition's uncommitted record")
    assert {r.partition for r in b.records} == {1 - kept}
    b.stop.set()
    b.join(10)
    a.close()
    bus.close()


def _one_partition_consumer(make_cfg, name: str, records: int = 1):
    """A bus, ``records`` tasks on partition 0 of a one-partition topic, and a consumer of group ``name`` that has
    polled them all: (bus, consumer, the records)."""
    bus = Bus(make_cfg(topics__partitions=1), client_id=name)
    prod = bus.producer()
    for i in range(records):
        prod.send(T.TASKS, Task(task_id=f"t{i}", model_py="m"), key="k", partition=0).get(10)
    prod.close()
    c = bus.consumer([T.TASKS], group_id=name, client_id="c")
    got = []
    _wait(lambda: got.extend(c.poll(timeout_s=0.2)) or len(got) == records, what=f"{records} record(s)")
    return bus, c, got


def test_an_async_commit_left_unanswered_is_sent_again_when_idle(make_cfg, monkeypatch):
    """kafka-python 3 can park an async commit while the coordinator's connection is at its in-flight limit (CI:
    "NodeNotReadyError: Node paused: {'max_in_flight'}") and never answer it: no ack, no failure to resend. A
    commit unanswered for STALE_COMMIT_S is sent again at the next idle poll (injected: a commit_async that
    sends nothing and never calls back)."""
    from cluster.bus import client as bc
    from cluster.bus.scan import committed_offsets

    bus, c, _ = _one_partition_consumer(make_cfg, "parked")
    monkeypatch.setattr(c.kafka, "commit_async", lambda offsets, callback: None)
    assert c.commit(sync=False)
    monkeypatch.undo()
    t0 = time.monotonic()
    c.recommit_failed()  # too early: the commit may still be answered
    assert committed_offsets(bus, bus.group("parked"), T.TASKS).get(0) == 0
    _wait(lambda: c.poll(timeout_s=0.2) == [] and c.recommit_failed() is None and
          committed_offsets(bus, bus.group("parked"), T.TASKS).get(0) == 1, what="the parked commit sent again")
    assert time.monotonic() - t0 >= bc.STALE_COMMIT_S
    c.close()
    bus.close()


def test_a_sync_commit_that_fails_is_sent_again_when_idle(make_cfg, monkeypatch):
    """A sync commit that fails with a Kafka error (the coordinator killed under it: a timeout, a refused
    connection) raises BusError to its caller and is kept: the next idle poll sends it again, so the group's lag
    falls without a later commit (a task feeder gated on that lag would otherwise stay shut; injected: one commit
    that raises KafkaTimeoutError)."""
    from kafka.errors import KafkaTimeoutError

    from cluster.bus.client import BusError
    from cluster.bus.scan import committed_offsets

    bus, c, got = _one_partition_consumer(make_cfg, "lost")

    def refuse(*a, **kw):
        raise KafkaTimeoutError("coordinator away")

    monkeypatch.setattr(c.kafka, "commit", refuse)
    with pytest.raises(BusError, match="commit failed"):
        c.commit(got[-1])
    monkeypatch.undo()
    assert committed_offsets(bus, bus.group("lost"), T.TASKS).get(0, 0) == 0  # nothing reached the group
    _wait(lambda: c.poll(timeout_s=0.2) == [] and c.recommit_failed() is None and
          committed_offsets(bus, bus.group("lost"), T.TASKS).get(0) == 1, what="the failed commit sent again")
    assert c.stats["commit_failures"] == 1
    c.close()
    bus.close()


def test_a_commit_on_a_wedged_coordinator_connection_lands_on_a_new_one(make_cfg):
    """The CI failure's third shape: the coordinator's connection stays paused at its in-flight limit ("Node
    paused: {'max_in_flight'}"), so the async commit and every resend are refused without being sent. A resend
    that cannot be sent within RECOMMIT_TIMEOUT_MS closes that connection; the next idle poll's resend lands on
    a new one (injected: the connection paused by hand, as kafka-python pauses it, and never unpaused). The paused
    connection also carries the heartbeats, so the member may be expelled and rejoin: then the record comes again
    and is committed as serve() would. On the previous client the member stays stuck on the paused connection."""
    from cluster.bus.scan import committed_offsets

    bus, c, _ = _one_partition_consumer(make_cfg, "wedged")
    coord = c.kafka._coordinator
    conn = c.kafka._client._manager._conns[coord.coordinator_id]
    conn.pause("max_in_flight")  # what kafka-python does at the limit; here nothing in flight will unpause it
    assert c.commit(sync=False)

    def serve_step() -> bool:  # what serve() does: commit what it is given, resend when idle
        again = c.poll(timeout_s=0.2)
        if again:  # the wedge also stopped the heartbeats: the member may have rejoined and been given it again
            c.commit(again[-1], sync=False)
            return False
        c.recommit_failed()
        return committed_offsets(bus, bus.group("wedged"), T.TASKS).get(0) == 1

    _wait(serve_step, timeout_s=60, what="the commit sent on a new connection")
    assert c.stats["coordinator_resets"] >= 1 and conn.closed
    c.close()
    bus.close()


def test_a_failed_commit_is_never_sent_again_over_a_newer_one(make_cfg, monkeypatch):
    """The CI failure's root cause ("not every record committed: [18, 18, 18]", reproduced with the worker's
    in-flight limit at 1): the async commit through record 17 was refused ("Node paused: {'max_in_flight'}"), the
    one through record 18 landed, and the idle resend sent the refused, older offset after it, moving the group
    back. Injected: the first async commit refused, the second answered by the broker before this consumer has
    seen the answer (callbacks run at the next poll)."""
    from kafka.errors import NodeNotReadyError

    from cluster.bus.scan import committed_offsets

    bus, c, got = _one_partition_consumer(make_cfg, "reorder", records=2)
    real_commit, calls = c.kafka.commit, []

    def commit_async(offsets, callback):
        calls.append(offsets)
        if len(calls) == 1:
            callback(offsets, NodeNotReadyError("Node paused: {'max_in_flight'}"))
        else:
            real_commit(offsets)  # the broker has it; this consumer's callback has not run yet

    monkeypatch.setattr(c.kafka, "commit_async", commit_async)
    assert c.commit(got[0], sync=False) and c.commit(got[1], sync=False)
    monkeypatch.undo()
    assert committed_offsets(bus, bus.group("reorder"), T.TASKS).get(0) == 2
    c.recommit_failed()
    assert committed_offsets(bus, bus.group("reorder"), T.TASKS).get(0) == 2, "the refused offset went over the newer"
    c.close()
    bus.close()


def test_a_moved_partition_is_not_committed_by_its_old_member_and_a_rewind_heals(make_cfg, monkeypatch):
    """The three-broker up test's stall (2026-12-07): the actor that lost a tasks partition in a rebalance finished
    its episode and committed the task's offset after the new owner had committed past it, rewinding the group's
    offset for good (the coordinator does not check who owns a partition, and kafka-python resends a sync commit
    until its timeout, across a rebalance), so the feeder's gate on that lag stayed shut. Now a member does not
    commit a partition it no longer owns, and an idle owner asserts its newest offsets again every REASSERT_S,
    which heals a rewind that got through anyway (injected: the old member's raw kafka-python commit)."""
    from kafka.structs import OffsetAndMetadata, TopicPartition

    from cluster.bus import client as bc
    from cluster.bus.scan import committed_offsets

    monkeypatch.setattr(bc, "REASSERT_S", 0.5, raising=False)
    bus = Bus(make_cfg(topics__partitions=2), client_id="moved")
    prod = bus.producer()
    for p in (0, 1):
        for i in range(2):
            prod.send(T.TASKS, Task(task_id=f"t{p}{i}", model_py="m"), key="k", partition=p).get(10)
    prod.close()
    old = _Owner(bus, "old", "moved", commit_each=False)  # takes all four, commits none (episodes running)
    old.start()
    _wait(lambda: len(old.records) == 4, what="the old member's four records")
    new = _Owner(bus, "new", "moved", commit_each=True)
    new.start()
    _wait(lambda: len(old.assigned) == 1 and len(new.assigned) == 1, timeout_s=60, what="a 1/1 split")
    (_, moved), = new.assigned
    committed = lambda: committed_offsets(bus, bus.group("moved"), T.TASKS).get(moved)  # noqa: E731
    _wait(lambda: committed() == 2, timeout_s=60, what="the new owner committing the moved partition's records")
    first = next(r for r in old.records if r.partition == moved and r.offset == 0)
    assert old.call(lambda c: c.commit(first)) is False  # its episode finished after the partition moved
    assert old.consumer.stats["commits_not_owned"] == 1
    time.sleep(1.0)
    assert committed() == 2
    # what kafka-python's own resend could still do: the old member's commit landing after the move
    tp = TopicPartition(bus.topic(T.TASKS), moved)
    monkeypatch.setattr(bc, "REASSERT_S", 3600.0, raising=False)  # no reassert while the rewind is looked at
    time.sleep(1.0)  # a reassert already begun has landed
    old.call(lambda c: c.kafka.commit({tp: OffsetAndMetadata(1, "", -1)}))
    time.sleep(1.0)
    assert committed() == 1  # rewound: the coordinator took the old member's commit
    monkeypatch.setattr(bc, "REASSERT_S", 0.5, raising=False)
    _wait(lambda: committed() == 2, timeout_s=30, what="the owner's idle reassert healing the rewind")
    for m in (old, new):
        m.stop.set()
        m.join(30)
    bus.close()
