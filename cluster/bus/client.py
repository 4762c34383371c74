"""The Kafka bus every role talks through: typed producer, at-least-once consumer, DLQ.

``Bus(cfg)`` resolves the cluster (``bus.bootstrap_servers`` or the running embedded
broker). ``Producer.send`` encodes a schemas message (acks=all, idempotent,
compressed). ``Consumer.poll`` decodes; anything undecodable or of an unexpected kind
is sent to the DLQ with the error, source topic, partition and offset, and skipped.
Offsets are committed only by ``Consumer.commit`` (after the work is done). Request/
reply lives in ``cluster.bus.rpc`` and is re-exported here.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from cluster.bus.clients import consumer_kwargs, producer_kwargs
from cluster.bus.rpc import AsyncRequestClient, RequestClient, RequestTimeout, serve  # re-exported
from cluster.errors import KernelRLError, RetriableError, is_retriable
from schemas import codec
from schemas import topics as T
from schemas.messages import DeadLetter

log = logging.getLogger(__name__)


class BusError(RetriableError):
    """Kafka refused or could not deliver. Retriable (broker down, timeout) unless the kafka-python error it
    wraps (``cause``) says a retry cannot help (a record too large, no authorization)."""

    def __init__(self, message: str, cause: BaseException | None = None):
        super().__init__(message)
        if cause is not None:
            self.retriable = is_retriable(cause)


class MessageTooLarge(KernelRLError):
    """An encoded message exceeds bus.max_message_bytes."""


@dataclass
class Received:
    """One decoded message with where it came from."""

    msg: Any
    topic: str  # logical name (prefix removed)
    partition: int
    offset: int
    key: str | None = None
    timestamp_ms: int = 0
    raw_topic: str = field(default="", repr=False)


STALE_COMMIT_S = 2.0  # an async commit unanswered this long is sent again at the next idle poll
RECOMMIT_TIMEOUT_MS = 5000  # a resent commit's wait: the serving loop stays responsive, the next idle poll retries
# An idle consumer sends its newest offsets again this often, acknowledged or not: a commit of a partition's old owner
# can land after the new owner's (kafka-python resends a sync commit until its timeout, across a rebalance, and the
# coordinator does not check who owns a partition), rewinding the group's offset; the feeder gates on that lag, so
# the rewind stalled a whole run (three-broker up test, 2026-12-07) until the owner's offsets are asserted again.
REASSERT_S = 15.0


def _key_bytes(key) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    return str(key).encode()


class Bus:
    """Entry point: names topics, makes producers and consumers, owns the DLQ producer."""

    def __init__(self, cfg, client_id: str | None = None, bootstrap: str | None = None):
        from cluster.broker import embedded as broker

        self.cfg = cfg
        self.client_id = client_id or cfg.bus.client_id
        self.bootstrap = bootstrap or broker.bootstrap_servers(cfg)
        self._lock = threading.Lock()
        self._dlq_producer: Producer | None = None

    # names
    def topic(self, name: str) -> str:
        """Full topic name for a logical one; full names pass through unchanged."""
        prefix = self.cfg.bus.topic_prefix
        return name if prefix and name.startswith(prefix) else prefix + name

    def group(self, name: str) -> str:
        """Consumer-group id for a logical group name: prefixed like topics, so runs and
        tenants that share a cluster never share a group."""
        prefix = self.cfg.bus.topic_prefix
        return name if prefix and name.startswith(prefix) else prefix + name

    def logical(self, full: str) -> str:
        prefix = self.cfg.bus.topic_prefix
        return full[len(prefix):] if prefix and full.startswith(prefix) else full

    # clients
    def producer(self, **overrides) -> "Producer":
        return Producer(self, **overrides)

    def consumer(self, topics: Iterable[str], group_id: str | None, *, expected=None,
                 **overrides) -> "Consumer":
        group = self.group(group_id) if group_id else group_id
        return Consumer(self, list(topics), group, expected=expected, **overrides)

    def ensure_topics(self) -> dict[str, str]:
        """Create kernelrl's topics if missing (idempotent)."""
        from cluster.bus.topics_admin import create_all

        return create_all(self.cfg, self.bootstrap)

    def lag(self, group_id: str, topics: Iterable[str]) -> dict[str, int]:
        from cluster.bus.lag import group_lag

        return group_lag(self, self.group(group_id), topics)

    # dead letters
    def prepare_dead_letters(self) -> None:
        """Open the dead-letter producer now (a worker does at start), so a letter costs one acked send."""
        with self._lock:
            if self._dlq_producer is None:
                self._dlq_producer = Producer(self, linger_ms=0)

    def dead_letter(self, topic: str, partition: int, offset: int, error: str, payload: bytes,
                    key: bytes | None = None, consumer: str = "") -> None:
        """Publish a DeadLetter and wait for its ack (it is the only copy we keep)."""
        self.prepare_dead_letters()
        limit = self.cfg.bus.max_message_bytes - 64 * 1024
        letter = DeadLetter(source_topic=topic, partition=partition, offset=offset, error=error[:4000],
                            payload=bytes(payload or b"")[:limit], key=key or b"",
                            consumer=consumer or self.client_id)
        log.warning("dead-lettering %s[%d]@%d: %s", topic, partition, offset, error[:300])
        self._dlq_producer.send(T.DLQ, letter, key=topic).get(timeout=30)

    def close(self) -> None:
        with self._lock:
            if self._dlq_producer is not None:
                self._dlq_producer.close()
                self._dlq_producer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Future:
    """What ``Producer.send`` returns: ``get(timeout)`` -> RecordMetadata or BusError."""

    def __init__(self, inner):
        self._inner = inner

    def get(self, timeout: float | None = 30.0):
        from kafka.errors import KafkaError

        try:
            return self._inner.get(timeout=timeout)
        except KafkaError as exc:
            raise BusError(f"delivery failed: {type(exc).__name__}: {exc}", exc) from exc

    def add_callback(self, fn):
        self._inner.add_callback(fn)
        return self

    def add_errback(self, fn):
        self._inner.add_errback(fn)
        return self

    @property
    def inner(self):
        return self._inner


class Producer:
    """Typed producer: acks=all, idempotent, compressed, large messages allowed."""

    def __init__(self, bus: Bus, **overrides):
        from kafka import KafkaProducer

        self.bus = bus
        self.max_bytes = bus.cfg.bus.max_message_bytes
        client_id = overrides.pop("client_id", f"{bus.client_id}-producer")
        self._kwargs = producer_kwargs(bus.cfg, client_id, bus.bootstrap, **overrides)
        self._lock = threading.Lock()
        self._p = KafkaProducer(**self._kwargs)

    def _client(self):
        """The KafkaProducer, replaced first if a refused record left it failed for good: kafka-python (3.0.12)
        puts an idempotent producer in a fatal state after any non-retriable batch error (e.g. a record larger
        than the topic takes), and every later send would fail the same. One bad record costs only itself."""
        from kafka import KafkaProducer

        with self._lock:
            tm = getattr(self._p, "_transaction_manager", None)
            if tm is not None and tm.has_fatal_error():
                log.warning("producer %s failed for good (%s); replacing it", self._kwargs["client_id"],
                            tm.last_error)
                self._p.close(timeout=0)
                self._p = KafkaProducer(**self._kwargs)
            return self._p

    def send(self, topic: str, msg, key=None, partition: int | None = None) -> _Future:
        """Encode and send ``msg`` to a logical (or full) topic; returns a future."""
        return self.send_bytes(topic, codec.encode(msg), key=key, partition=partition,
                               kind=type(msg).KIND)

    def send_bytes(self, topic: str, payload: bytes, key=None, partition: int | None = None,
                   kind: str = "") -> _Future:
        from kafka.errors import KafkaError

        if len(payload) > self.max_bytes:
            raise MessageTooLarge(f"{kind or 'message'} of {len(payload)} bytes exceeds "
                                  f"bus.max_message_bytes={self.max_bytes}")
        headers = [("k", kind.encode())] if kind else None
        try:
            fut = self._client().send(self.bus.topic(topic), value=payload, key=_key_bytes(key),
                               partition=partition, headers=headers)
        except KafkaError as exc:
            raise BusError(f"send to {topic} failed: {type(exc).__name__}: {exc} "
                           "(does the topic exist? `kernelrl topics create`)", exc) from exc
        return _Future(fut)

    def flush(self, timeout_s: float | None = None) -> None:
        from kafka.errors import KafkaError

        try:
            self._p.flush(timeout=timeout_s)
        except KafkaError as exc:
            raise BusError(f"flush failed: {exc}", exc) from exc

    def partitions(self, topic: str) -> set[int]:
        return self._p.partitions_for(self.bus.topic(topic))

    def close(self, timeout_s: float = 30.0) -> None:
        self._p.close(timeout=timeout_s)


class Consumer:
    """Manual-commit consumer of typed messages; bad input goes to the DLQ and is skipped.

    Joined to ``group_id`` (partitions shared with the group) unless ``assign`` lists
    partitions explicitly (then ``group_id`` may be None). ``commit(rec)`` commits
    everything up to and including ``rec`` in its partition.
    """

    def __init__(self, bus: Bus, topics: list[str], group_id: str | None, *, expected=None,
                 assign: Iterable[tuple[str, int]] | None = None, dlq: bool = True, **overrides):
        from kafka import KafkaConsumer, TopicPartition

        self.bus = bus
        self.group_id = group_id
        self.expected = tuple(expected) if isinstance(expected, (list, tuple, set)) else (
            (expected,) if expected else ())
        self.dlq = dlq
        self.stats = {"received": 0, "dead_lettered": 0, "commits": 0, "commit_failures": 0, "coordinator_resets": 0,
                      "commits_not_owned": 0}
        self._delivered_hi: dict = {}
        self._committed: dict = {}
        self._skipped: dict = {}
        self._acked: dict = {}  # tp -> highest offset the group coordinator acknowledged
        self._failed: set = set()  # partitions whose commit failed: their newest offset (_committed) is sent again
        self._sent_at: dict = {}  # tp -> when the newest commit was sent (an unanswered one is sent again)
        self._reasserted_at = time.monotonic()
        client_id = overrides.pop("client_id", f"{bus.client_id}-consumer")
        self._kwargs = consumer_kwargs(bus.cfg, client_id, group_id, bus.bootstrap, **overrides)
        self._topics = [bus.topic(t) for t in topics]
        self._unstable_since: float | None = None
        self.rebuilds = 0
        self._c = KafkaConsumer(**self._kwargs)
        if assign is not None:
            self._c.assign([TopicPartition(bus.topic(t), p) for t, p in assign])
        else:
            self._c.subscribe(self._topics, listener=_Listener(self))

    @property
    def kafka(self):
        """The underlying KafkaConsumer (for seek/position and other advanced use)."""
        return self._c

    def assignment(self) -> set[tuple[str, int]]:
        return {(self.bus.logical(tp.topic), tp.partition) for tp in self._c.assignment()}

    def poll(self, timeout_s: float | None = None, max_records: int | None = None) -> list[Received]:
        from kafka.errors import KafkaError

        timeout_ms = int((self.bus.cfg.bus.poll_timeout_ms / 1000 if timeout_s is None else timeout_s) * 1000)
        try:
            batches = self._c.poll(timeout_ms=timeout_ms, max_records=max_records)
        except KafkaError as exc:
            raise BusError(f"poll failed: {type(exc).__name__}: {exc}", exc) from exc
        self._watch_membership()
        out: list[Received] = []
        for tp, records in batches.items():
            for r in records:
                rec = self._decode(tp, r)
                if rec is not None:
                    out.append(rec)
                    self._delivered_hi[tp] = r.offset
        self.stats["received"] += len(out)
        return out

    def _decode(self, tp, r) -> Received | None:
        try:
            msg = codec.decode(r.value)
            if self.expected and not isinstance(msg, self.expected):
                raise codec.SchemaError(f"unexpected message kind {type(msg).KIND!r} on {tp.topic} "
                                        f"(expected {[e.KIND for e in self.expected]})")
        except Exception as exc:  # noqa: BLE001 - any failure to decode is bad input: DLQ it, never crash
            self._dead_letter(tp, r, exc)
            return None
        key = r.key.decode(errors="replace") if r.key is not None else None
        return Received(msg=msg, topic=self.bus.logical(tp.topic), partition=tp.partition, offset=r.offset,
                        key=key, timestamp_ms=r.timestamp, raw_topic=tp.topic)

    def _dead_letter(self, tp, r, exc: Exception) -> None:
        self.stats["dead_lettered"] += 1
        err = f"{type(exc).__name__}: {exc}"
        if self.dlq:
            self.bus.dead_letter(tp.topic, tp.partition, r.offset, err, r.value or b"", r.key,
                                 consumer=f"{self.bus.client_id}/{self.group_id or 'assigned'}")
        else:
            log.warning("skipping bad message %s[%d]@%d: %s", tp.topic, tp.partition, r.offset, err)
        if self.group_id is None:
            return
        hi = self._delivered_hi.get(tp)
        if hi is None or self._committed.get(tp, -1) > hi:
            self._commit_offsets({tp: r.offset + 1}, sync=True)  # nothing of ours pending before it
        else:
            self._skipped.setdefault(tp, set()).add(r.offset)

    def commit(self, rec: Received | None = None, sync: bool = True) -> bool:
        """Commit through ``rec`` (or everything delivered so far). False if the group moved on."""
        from kafka import TopicPartition

        if self.group_id is None:
            return True
        if rec is not None:
            targets = {TopicPartition(rec.raw_topic or self.bus.topic(rec.topic), rec.partition): rec.offset + 1}
        else:
            targets = {tp: hi + 1 for tp, hi in self._delivered_hi.items()}
        for tp, nxt in list(targets.items()):
            skipped = self._skipped.get(tp)
            while skipped and nxt in skipped:
                skipped.discard(nxt)
                nxt += 1
            if skipped:
                self._skipped[tp] = {o for o in skipped if o > nxt}
            targets[tp] = nxt
        return self._commit_offsets(targets, sync=sync) if targets else True

    def commit_positions(self, topic: str, positions: dict[int, int], timeout_ms: int | None = None) -> bool:
        """Commit explicit next offsets ({partition: offset}) of ``topic``, synchronously: a position kept
        elsewhere (the learner's checkpoint). One that fails is kept and sent again at an idle poll
        (``recommit_failed``), as every other commit."""
        from kafka import TopicPartition

        full = self.bus.topic(topic)
        targets = {TopicPartition(full, p): o for p, o in positions.items()}
        return self._commit_offsets(targets, sync=True, timeout_ms=timeout_ms) if targets else True

    def _commit_offsets(self, targets: dict, sync: bool, timeout_ms: int | None = None) -> bool:
        from kafka.errors import CommitFailedError, KafkaError, RebalanceInProgressError
        from kafka.structs import OffsetAndMetadata

        targets = self._owned(targets)
        if not targets:
            return False
        offsets = {tp: OffsetAndMetadata(o, "", -1) for tp, o in targets.items()}
        try:
            if sync:
                self._c.commit(offsets, timeout_ms=timeout_ms)
            else:
                self._c.commit_async(offsets, callback=self._on_async_commit)
        except (CommitFailedError, RebalanceInProgressError) as exc:
            # The group is rebalancing (or moved on without us). A partition that comes back to this member keeps
            # its position, so its records are not redelivered: kept as sent-but-unacknowledged, the commit is
            # sent again after the rebalance (``_reassigned``); a partition that moves is forgotten.
            self.stats["commit_failures"] += 1
            log.warning("commit refused by a rebalance (sent again if this consumer keeps the partition): %s", exc)
            for tp, o in targets.items():
                self._committed[tp] = max(o, self._committed.get(tp, -1))
                self._failed.add(tp)
            return False
        except KafkaError as exc:
            # the coordinator away (a broker killed under the commit, a timeout): the caller hears of it, and the
            # offset is kept for the next idle poll to send again (recommit_failed). Left unsent, the group's lag on
            # this partition stays up until a later commit, which a feeder gated on that lag may never let come
            self.stats["commit_failures"] += 1
            for tp, o in targets.items():
                self._committed[tp] = max(o, self._committed.get(tp, -1))
                self._failed.add(tp)
            raise BusError(f"commit failed: {type(exc).__name__}: {exc}", exc) from exc
        self.stats["commits"] += 1
        sent = time.monotonic()
        for tp, o in targets.items():
            self._committed[tp] = max(o, self._committed.get(tp, -1))
            self._sent_at[tp] = sent
            if sync:
                self._acked[tp] = max(o, self._acked.get(tp, -1))
        return True

    def _owned(self, targets: dict) -> dict:
        """The targets of partitions this member owns now (all of them for a consumer without a group
        subscription): a member's commit of a partition that moved to another would rewind the new owner's."""
        if self.group_id is None or not self._c.subscription():
            return targets
        owned = self._c.assignment()
        gone = [tp for tp in targets if tp not in owned]
        if gone:
            self.stats["commits_not_owned"] += len(gone)
            log.info("not committing %s: the partitions moved to another member", sorted(str(tp) for tp in gone))
        return {tp: o for tp, o in targets.items() if tp in owned}

    def _on_async_commit(self, offsets, response) -> None:
        if isinstance(response, Exception):
            from kafka.errors import CommitFailedError

            self.stats["commit_failures"] += 1
            if isinstance(response, CommitFailedError):
                # The group rebalanced under the commit. If the partition comes back to this member, kafka-python
                # keeps its fetch position, so the record is never redelivered: the commit must be sent again
                # (``_Listener`` keeps this for kept partitions and forgets it for moved ones).
                log.warning("async commit refused by a rebalance (sent again if this consumer keeps the "
                            "partition): %s", response)
            else:
                log.warning("async commit failed (sent again when the consumer is idle): %s", response)
            self._failed.update(offsets)
            return
        for tp, om in offsets.items():
            self._acked[tp] = max(om.offset, self._acked.get(tp, -1))

    def recommit_failed(self) -> None:
        """Send again the async commits that failed (a busy coordinator); without this the last record of a
        burst stays uncommitted until the next record or shutdown, and is served twice after a crash."""
        # An async commit can also stay unanswered (kafka-python 3 parks it while the coordinator's connection is
        # at its in-flight limit, seen in CI): one sent over STALE_COMMIT_S ago and still unacknowledged is sent
        # again too. Sending an offset twice is harmless.
        now = time.monotonic()
        stale = {tp for tp, o in self._committed.items()
                 if o > self._acked.get(tp, -1) and now - self._sent_at.get(tp, now) > STALE_COMMIT_S}
        if self.group_id is not None and now - self._reasserted_at > REASSERT_S:
            self._reasserted_at = now
            stale |= self._reassert()
        pending = stale | self._failed
        owned = self._c.assignment() if pending else set()
        # The partition's newest offset, never the failed one: a later commit may have been sent after the failed
        # one and be answered but not yet acknowledged here (callbacks run at the next poll), and resending the
        # older offset after it moves the group's position back (seen: 19 committed, then 18 resent over it).
        targets = {tp: self._committed[tp] for tp in pending
                   if tp in self._committed and tp in owned and self._committed[tp] > self._acked.get(tp, -1)}
        if not targets:
            self._failed.clear()
            return
        try:
            if self._commit_offsets(targets, sync=True, timeout_ms=RECOMMIT_TIMEOUT_MS):  # idle: the wait is free
                self._failed.clear()
            # refused by a rebalance: _commit_offsets kept them; the rebalance's assignment decides (_reassigned)
        except BusError as exc:
            log.warning("commit sent again failed (next idle poll tries again): %s", exc)
            self._reset_coordinator_connection(exc.__cause__)

    def _reassert(self) -> set:
        """The owned partitions whose newest offset this member committed: marked unacknowledged, so the idle
        resend below asserts them again (REASSERT_S)."""
        owned = self._c.assignment()
        mine = {tp for tp in self._committed if tp in owned}
        for tp in mine:
            self._acked.pop(tp, None)
        return mine

    def _reset_coordinator_connection(self, cause) -> None:
        """Close the group coordinator's connection after a resent commit could not even be sent.

        kafka-python 3.0.12 can leave that connection paused at its in-flight limit (CI: "NodeNotReadyError: Node
        paused: {'max_in_flight'}" and every later commit refused the same way) until its request timeout, 30 s or
        more, closes it. Closing it now fails what is in flight on it; the next commit reconnects."""
        from kafka.errors import KafkaTimeoutError, NodeNotReadyError

        if not isinstance(cause, (KafkaTimeoutError, NodeNotReadyError)):
            return
        coord = getattr(self._c, "_coordinator", None)
        node, client = getattr(coord, "coordinator_id", None), getattr(self._c, "_client", None)
        if node is None or client is None:
            return
        log.warning("closing the group coordinator's connection (node %s) so the commit is sent on a new one", node)
        with getattr(client, "_lock", contextlib.nullcontext()):
            client.close(node_id=node)
        self.stats["coordinator_resets"] += 1

    def _reassigned(self, kept, assigned) -> None:
        """After a rebalance: partitions this member held and got back keep their fetch position in
        kafka-python, so their bookkeeping stays too, and a commit not yet acknowledged (refused by the
        rebalance, or still in flight) is sent again at the next idle poll. Every other partition starts fresh."""
        self._forget(set(assigned) - set(kept))
        for tp in kept:
            done = self._committed.get(tp, -1)
            if done > self._acked.get(tp, -1):
                self._failed.add(tp)

    def _forget(self, partitions) -> None:
        for tp in partitions:
            self._delivered_hi.pop(tp, None)
            self._committed.pop(tp, None)
            self._skipped.pop(tp, None)
            self._failed.discard(tp)
            self._acked.pop(tp, None)
            self._sent_at.pop(tp, None)

    def _watch_membership(self) -> None:
        """Rebuild the client when its group membership never settles.

        kafka-python 3.0.12 can lose a SyncGroup reply when two groups rebalance in one
        process at the same moment: the member then waits forever with no partitions
        while the broker expires it. A member not stable for several session timeouts
        is recreated (nothing was assigned to it, so nothing is lost or committed).
        """
        from kafka.structs import MemberState

        coord = getattr(self._c, "_coordinator", None)
        if self.group_id is None or coord is None or getattr(coord, "state", None) is MemberState.STABLE:
            self._unstable_since = None
            return
        now = time.monotonic()
        if self._unstable_since is None:
            self._unstable_since = now
            return
        limit = max(10.0, 3 * self.bus.cfg.bus.session_timeout_ms / 1000)
        if now - self._unstable_since < limit or self._c.assignment():
            return
        from kafka import KafkaConsumer

        log.warning("consumer of %s in group %s not stable for %.0fs: rebuilding the client",
                    self._topics, self.group_id, now - self._unstable_since)
        try:
            self._c.close(autocommit=False)
        except Exception as exc:  # noqa: BLE001 - the stuck client may fail to close; it is dropped anyway
            log.warning("closing the stuck consumer: %s", exc)
        self._c = KafkaConsumer(**self._kwargs)
        self._c.subscribe(self._topics, listener=_Listener(self))
        self._unstable_since = None
        self.rebuilds += 1

    def close(self) -> None:
        """Leave the group (partitions move to the others at once) without committing."""
        self._c.close(autocommit=False)


def _listener_base():
    from kafka import ConsumerRebalanceListener

    return ConsumerRebalanceListener


class _Listener(_listener_base()):
    """Per-partition bookkeeping across rebalances. Under the eager protocol "revoked" is a notice: a partition
    that comes straight back keeps its position (kafka-python 3), so its bookkeeping is kept until the assignment
    says whether it moved. Lost partitions (membership expired) restart from the committed offset: forgotten."""

    def __init__(self, consumer: Consumer):
        self._consumer = consumer
        self._revoked: set = set()

    def on_partitions_revoked(self, revoked):
        self._revoked |= set(revoked)

    def on_partitions_assigned(self, assigned):
        kept = self._revoked & set(assigned)
        self._consumer._forget(self._revoked - kept)
        self._revoked = set()
        self._consumer._reassigned(kept, assigned)

    def on_partitions_lost(self, lost):
        self._consumer._forget(set(lost) | self._revoked)
        self._revoked = set()


__all__ = ["Bus", "Producer", "Consumer", "Received", "BusError", "MessageTooLarge",
           "RequestClient", "AsyncRequestClient", "RequestTimeout", "serve"]
