"""Request/reply over Kafka: RequestClient (sync), AsyncRequestClient (asyncio), serve().

A request carries ``header`` (schemas.RequestHeader): request id, reply topic +
partition, deadline, attempt. Each client reads one partition of ``tool.replies``
(manual assignment, from the end, no group): by default ``crc32(name) % partitions``,
or the ``partition`` given (e.g. the actor index). Clients are unique per partition
while there are at most ``topics.reply_partitions`` of them with explicit partitions;
beyond that, or on a hash collision, clients share a partition, which stays correct
(a client keeps only replies whose request id it is waiting for) at the cost of
reading the other's replies. Retries reuse the request id, so any attempt's reply
answers the request; a second reply is a duplicate, one after the client gave up is
late; both are dropped and counted, as are stale replies for unknown ids.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import threading
import zlib
from typing import Any, Callable

from cluster.bus.serve import default_error_reply, serve  # re-exported
from cluster.errors import KernelRLError, RetriableError, is_retriable
from schemas import topics as T
from schemas.messages import new_id, now_ms

log = logging.getLogger(__name__)


class RequestTimeout(RetriableError):
    """No reply arrived within the timeout after all retries."""


class RequestRefused(KernelRLError):
    """The broker refused the request for good (too large, not authorized): no retry can deliver it."""


class _Pending:
    __slots__ = ("deliver",)

    def __init__(self, deliver: Callable[[Any], None]):
        self.deliver = deliver


class _Failed:
    """Delivered in place of a reply when the request cannot be answered (a send no retry can fix)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


def _unwrap(result):
    if isinstance(result, _Failed):
        raise result.exc
    return result


class RequestClient:
    """Sync request/reply client; a background thread reads this client's reply partition."""

    RECENT = 8192  # finished request ids remembered to tell duplicates/late replies apart

    def __init__(self, bus, name: str, partition: int | None = None):
        self.bus = bus
        self.name = name
        self.reply_topic = bus.topic(T.TOOL_REPLIES)
        self._producer = bus.producer(linger_ms=0)
        n = len(self._producer.partitions(T.TOOL_REPLIES) or ())
        if n == 0:
            raise KernelRLError(f"topic {self.reply_topic} does not exist: run `kernelrl topics create`")
        self.partition = (zlib.crc32(name.encode()) % n) if partition is None else partition % n
        self._consumer = bus.consumer([], None, assign=[(T.TOOL_REPLIES, self.partition)],
                                      fetch_max_wait_ms=bus.cfg.bus.fetch_max_wait_ms)
        self._seek_to_end()
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._recent: collections.OrderedDict[str, str] = collections.OrderedDict()
        self.stats = collections.Counter()
        self._stop = threading.Event()
        self._broken: KernelRLError | None = None
        self._thread = threading.Thread(target=self._read_loop, name=f"replies-{name}", daemon=True)
        self._thread.start()

    def _seek_to_end(self) -> None:
        from kafka import TopicPartition

        tp = TopicPartition(self.reply_topic, self.partition)
        self._consumer.kafka.seek_to_end(tp)
        self._consumer.kafka.position(tp)  # resolve now: replies from here on are ours to see

    # ------------------------------------------------------------------ reader thread
    def _read_loop(self) -> None:
        while not self._stop.is_set():
            try:
                records = self._consumer.poll(timeout_s=0.1)
            except Exception as exc:  # noqa: BLE001 - sorted by is_retriable: the others end the reader
                if not is_retriable(exc):
                    self._break(exc)
                    return
                log.warning("reply poll failed (%s); retrying", exc)
                self._stop.wait(0.5)
                continue
            for rec in records:
                self._dispatch(rec.msg)

    def _dispatch(self, reply) -> None:
        rid = getattr(reply, "request_id", "") or ""
        with self._lock:
            pending = self._pending.pop(rid, None)
            if pending is not None:
                self._remember(rid, "answered")
                self.stats["replies"] += 1
            else:
                what = self._recent.get(rid)
                self.stats[{"answered": "duplicates", "abandoned": "late"}.get(what, "stale")] += 1
        if pending is not None:
            pending.deliver(reply)
        else:
            log.debug("dropped reply for %s (%s)", rid, self._recent.get(rid, "unknown id"))

    def _break(self, exc: BaseException) -> None:
        """The reply reader hit an error no retry can fix: fail every waiting request, and every later one."""
        log.error("reply reader of %s stopped: %s: %s", self.name, type(exc).__name__, exc)
        self._broken = KernelRLError(f"request client {self.name} cannot read its replies: {type(exc).__name__}: {exc}")
        with self._lock:
            rids = list(self._pending)
        for rid in rids:
            self._fail(rid, self._broken)

    def _fail(self, rid: str, exc: BaseException) -> None:
        """Answer request ``rid`` with ``exc`` (raised to its caller at once, not after the timeouts)."""
        with self._lock:
            pending = self._pending.pop(rid, None)
            if pending is not None:
                self._remember(rid, "abandoned")
        if pending is not None:
            pending.deliver(_Failed(exc))

    def _remember(self, rid: str, what: str) -> None:
        self._recent[rid] = what
        self._recent.move_to_end(rid)
        while len(self._recent) > self.RECENT:
            self._recent.popitem(last=False)

    # ------------------------------------------------------------------ bookkeeping
    def _register(self, rid: str, deliver: Callable[[Any], None]) -> None:
        with self._lock:
            self._pending[rid] = _Pending(deliver)

    def _abandon(self, rid: str) -> None:
        with self._lock:
            if self._pending.pop(rid, None) is not None:
                self._remember(rid, "abandoned")

    def _prepare(self, msg, rid: str, attempt: int, timeout_s: float):
        header = dataclasses.replace(msg.header, request_id=rid, reply_topic=self.reply_topic,
                                     reply_partition=self.partition, attempt=attempt, sender=self.name,
                                     deadline_ms=now_ms() + int(timeout_s * 1000))
        return dataclasses.replace(msg, header=header)

    def _send(self, topic: str, msg, key) -> None:
        """Send without waiting for the ack: a lost request shows up as a timeout and is retried; one the
        broker refuses for good (too large, not authorized) fails the request at once."""
        rid = msg.header.request_id

        def failed(exc):
            self.stats["send_errors"] += 1
            log.warning("request %s to %s not delivered: %s", rid, topic, exc)
            if not is_retriable(exc):
                self._fail(rid, RequestRefused(f"request {rid} to {topic} refused by the broker: "
                                               f"{type(exc).__name__}: {exc}"))

        self._producer.send(topic, msg, key=key).add_errback(failed)

    def _params(self, msg, timeout_s, retries, backoff_s):
        cfg = self.bus.cfg.bus
        if not hasattr(msg, "header"):
            raise KernelRLError(f"{type(msg).__name__} is not a request (it has no header)")
        if self._broken is not None:
            raise self._broken
        rid = msg.header.request_id or new_id()
        return (rid, cfg.request_timeout_s if timeout_s is None else timeout_s,
                cfg.request_retries if retries is None else retries,
                cfg.retry_backoff_s if backoff_s is None else backoff_s)

    @staticmethod
    def _backoff(base: float, attempt: int) -> float:
        return min(base * (2 ** attempt), 30.0) * random.uniform(0.8, 1.2)

    # ------------------------------------------------------------------ API
    def request(self, topic: str, msg, timeout_s: float | None = None, retries: int | None = None,
                backoff_s: float | None = None, key=None):
        """Send ``msg`` and wait for its reply; retries on timeout; raises RequestTimeout."""
        rid, timeout_s, retries, backoff_s = self._params(msg, timeout_s, retries, backoff_s)
        key = key or getattr(msg, "episode_id", None) or rid
        box: list = []
        done = threading.Event()

        def deliver(reply):
            box.append(reply)
            done.set()

        self._register(rid, deliver)
        try:
            for attempt in range(retries + 1):
                if attempt:
                    self.stats["retries"] += 1
                try:
                    self._send(topic, self._prepare(msg, rid, attempt, timeout_s), key)
                except Exception as exc:  # sorted by is_retriable: the others fail the request
                    if not is_retriable(exc):
                        raise
                    log.warning("request %s attempt %d: send failed: %s", rid, attempt, exc)
                if done.wait(timeout_s):
                    return _unwrap(box[0])
                self.stats["timeouts"] += 1
                if attempt < retries and done.wait(self._backoff(backoff_s, attempt)):
                    return _unwrap(box[0])  # a slow earlier attempt answered during the backoff
            raise RequestTimeout(f"no reply to {type(msg).__name__} {rid} on {topic} after "
                                 f"{retries + 1} attempt(s) of {timeout_s:.1f}s")
        finally:
            self._abandon(rid)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
        self._producer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncRequestClient:
    """asyncio (uvloop) face of RequestClient: the same reader thread resolves futures."""

    def __init__(self, bus, name: str, partition: int | None = None, client: RequestClient | None = None):
        self._client = client or RequestClient(bus, name, partition)
        self._warm: set[str] = set()  # topics whose metadata the producer has: send() won't block

    @property
    def stats(self):
        return self._client.stats

    @property
    def partition(self) -> int:
        return self._client.partition

    async def request(self, topic: str, msg, timeout_s: float | None = None, retries: int | None = None,
                      backoff_s: float | None = None, key=None):
        c = self._client
        rid, timeout_s, retries, backoff_s = c._params(msg, timeout_s, retries, backoff_s)
        key = key or getattr(msg, "episode_id", None) or rid
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()

        def deliver(reply):
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(reply))

        c._register(rid, deliver)
        try:
            for attempt in range(retries + 1):
                if attempt:
                    c.stats["retries"] += 1
                prepared = c._prepare(msg, rid, attempt, timeout_s)
                try:
                    if topic in self._warm:
                        c._send(topic, prepared, key)  # non-blocking once the topic's metadata is known
                    else:  # the first send may wait for metadata: keep that off the loop
                        await loop.run_in_executor(None, c._send, topic, prepared, key)
                        self._warm.add(topic)
                except Exception as exc:  # sorted by is_retriable: the others fail the request
                    if not is_retriable(exc):
                        raise
                    log.warning("request %s attempt %d: send failed: %s", rid, attempt, exc)
                if await _wait(fut, timeout_s):
                    return _unwrap(fut.result())
                c.stats["timeouts"] += 1
                if attempt < retries and await _wait(fut, c._backoff(backoff_s, attempt)):
                    return _unwrap(fut.result())
            raise RequestTimeout(f"no reply to {type(msg).__name__} {rid} on {topic} after "
                                 f"{retries + 1} attempt(s) of {timeout_s:.1f}s")
        finally:
            c._abandon(rid)

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._client.close)

    def close(self) -> None:
        self._client.close()


async def _wait(fut: asyncio.Future, timeout_s: float) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        return True
    except asyncio.TimeoutError:
        return fut.done()


__all__ = ["RequestClient", "AsyncRequestClient", "RequestTimeout", "RequestRefused", "serve", "default_error_reply"]
