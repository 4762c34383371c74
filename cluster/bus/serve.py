"""The worker loop behind every tool worker: consume a request, handle, reply, commit.

``serve(bus, topic, group_id, handler, stop_event)`` polls ``topic`` in ``group_id``;
for each request it calls ``handler(msg) -> reply`` and publishes the reply to the
request's ``header.reply_topic``/``reply_partition``, waits for the ack, then commits
(at-least-once). A handler's retriable error (cluster.errors.retry) is retried a few times in place; any other
error becomes an error reply (``on_error`` or the defaults below), or a DeadLetter
when no error reply can be built. Every consumed request is answered or dead-lettered
with its reason: expired ones (past their deadline), ones without a reply address or
with one that is not this cluster's replies topic, and ones whose reply the broker
refuses. ``stop_event`` (set from a SIGTERM handler) ends the loop between messages: what was not finished is not committed and will be redelivered.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Callable

from cluster.errors import is_retriable, retry
from schemas.messages import (CompileRequest, CompileResult, EvaluateRequest, EvaluateResult, FilterRequest,
                              FilterResult, now_ms)

log = logging.getLogger(__name__)
_NO_LOCK = contextlib.nullcontext()


def default_error_reply(msg, exc: BaseException):
    """An error result the asking actor can read, for the known request types; else None."""
    error = f"{type(exc).__name__}: {exc}"[:4000]
    rid = msg.header.request_id
    if isinstance(msg, CompileRequest):
        return CompileResult(request_id=rid, episode_id=msg.episode_id, ok=False, error=error, fault="infra")
    if isinstance(msg, EvaluateRequest):
        return EvaluateResult(request_id=rid, episode_id=msg.episode_id, task_id=msg.task_id,
                              compiled=False, correct=False, reward=0.0, error=error, fault="infra")
    if isinstance(msg, FilterRequest):
        return FilterResult(request_id=rid, ok=False, rule="worker_error", reason=error, fault="infra")
    return None


def _handle(handler, msg, retries: int, stop_event) -> Any:
    """``handler(msg)``, a retriable failure retried in place (``retries`` times) unless we are stopping."""
    return retry(lambda: handler(msg), f"handler of {type(msg).__name__}", attempts=retries + 1, backoff_s=0.2,
                 max_backoff_s=5.0, stop=stop_event)


def serve(bus, topic: str, group_id: str, handler: Callable[[Any], Any],
          stop_event: threading.Event | None = None, *, expected=None,
          on_error: Callable[[Any, BaseException], Any] | None = None,
          handler_retries: int = 2, max_messages: int | None = None,
          poll_timeout_s: float = 0.1, on_ready: Callable[[], None] | None = None,
          consumer_overrides: dict | None = None, concurrency: int = 1) -> dict:
    """Run the worker loop until ``stop_event`` is set (or ``max_messages`` are done). With ``concurrency`` > 1,
    up to that many requests are handled at once (a cache hit is answered while a long build runs): each
    partition is still committed in offset order, only through requests that are all finished."""
    stop_event = stop_event or threading.Event()
    on_error = on_error or default_error_reply
    # One request per poll: every poll lets the group coordinator fence this member first, so a worker that
    # was frozen (SIGSTOP, a long GC) past its session rejoins instead of running a prefetched batch of
    # requests the group has already given to another worker. A job takes ms to minutes; a poll, microseconds.
    consumer = bus.consumer([topic], group_id, expected=expected,
                            **{"max_poll_records": 1, **(consumer_overrides or {})})
    producer = bus.producer(linger_ms=0)
    bus.prepare_dead_letters()
    stats = {"handled": 0, "errors": 0, "expired": 0, "dead_lettered": 0}
    if concurrency > 1:
        return _serve_pool(bus, consumer, producer, handler, on_error, handler_retries, stop_event, stats,
                           concurrency, max_messages, poll_timeout_s, on_ready)
    done: dict = {}  # (topic, partition) -> last finished record: committed synchronously at exit
    ready = False
    commit = consumer.commit
    try:
        while not stop_event.is_set():
            records, ready = _poll(consumer, poll_timeout_s, ready, on_ready)
            for rec in records:
                if stop_event.is_set():
                    break  # not finished: not committed, redelivered to whoever comes next
                _serve_one(bus, producer, commit, rec, handler, on_error, handler_retries, stop_event, stats)
                done[(rec.topic, rec.partition)] = rec
                if max_messages and stats["handled"] + stats["expired"] + stats["errors"] >= max_messages:
                    stop_event.set()
    finally:
        for rec in done.values():
            consumer.commit(rec, sync=True)
        stats["dead_lettered"] += consumer.stats["dead_lettered"]
        consumer.close()
        producer.close()
    return stats


def _poll(consumer, timeout_s: float, ready: bool, on_ready, idle: bool = True) -> tuple[list, bool]:
    """One poll; when idle, failed async commits are sent again; on_ready once partitions are assigned."""
    records = consumer.poll(timeout_s=timeout_s)
    if not records and idle:
        consumer.recommit_failed()
    if not ready and consumer.assignment():
        ready = True
        if on_ready:
            on_ready()
    return records, ready


def _serve_pool(bus, consumer, producer, handler, on_error, retries, stop_event, stats, concurrency: int,
                max_messages, poll_timeout_s: float, on_ready) -> dict:
    """serve() with up to ``concurrency`` handlers on threads. The consumer is used by this thread only
    (kafka-python's is not thread-safe): handlers put their finished records on a queue, and this thread commits
    each partition through its longest run of finished requests, so a crash redelivers every unfinished one."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    finished: queue.Queue = queue.Queue()
    pending: dict = {}  # (raw topic, partition) -> {offset: record or None (running)}
    lock = threading.Lock()
    failures: list[BaseException] = []

    def job(rec) -> None:
        try:
            _serve_one(bus, producer, lambda r, sync=False: finished.put(r), rec, handler, on_error, retries,
                       stop_event, stats, lock)
        except BaseException as exc:  # noqa: BLE001 - Abandoned (stopping) and the like: left uncommitted, re-raised
            failures.append(exc)
            stop_event.set()

    def commit_finished(sync: bool = False) -> None:
        while True:
            try:
                rec = finished.get_nowait()
            except queue.Empty:
                break
            pending[(rec.raw_topic, rec.partition)][rec.offset] = rec
        for offs in pending.values():
            last = None
            for off in sorted(offs):
                if offs[off] is None:
                    break
                last = offs.pop(off)
            if last is not None:
                consumer.commit(last, sync=sync)

    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="serve")
    running: set = set()
    ready = False
    try:
        while not stop_event.is_set():
            commit_finished()
            running = {f for f in running if not f.done()}
            if len(running) >= concurrency:
                time.sleep(min(poll_timeout_s, 0.02))
                continue
            records, ready = _poll(consumer, poll_timeout_s, ready, on_ready, idle=not running)
            for rec in records:
                pending.setdefault((rec.raw_topic, rec.partition), {})[rec.offset] = None
                running.add(pool.submit(job, rec))
                if max_messages and stats["handled"] + stats["expired"] + stats["errors"] + len(running) >= max_messages:
                    stop_event.set()
    finally:
        pool.shutdown(wait=True)  # handlers see stop_event (retries stop; workers abandon their jobs)
        commit_finished(sync=True)
        for key, offs in pending.items():  # what finished after a gap stays uncommitted: redelivered
            if offs:
                log.info("%s[%d]: %d request(s) left uncommitted at exit", key[0], key[1], len(offs))
        stats["dead_lettered"] += consumer.stats["dead_lettered"]
        consumer.close()
        producer.close()
    if failures:
        raise failures[0]
    return stats


def _serve_one(bus, producer, commit, rec, handler, on_error, retries, stop_event, stats,
               lock: threading.Lock | None = None) -> None:
    lock = lock or _NO_LOCK
    msg = rec.msg
    header = getattr(msg, "header", None)
    if header is not None and header.deadline_ms and now_ms() > header.deadline_ms:
        with lock:
            stats["expired"] += 1
        late = now_ms() - header.deadline_ms
        log.info("skipping expired request %s (%d ms late)", header.request_id, late)
        # kept with its reason: every consumed request is answered or dead-lettered, none silently dropped
        dead_letter_record(bus, rec, f"expired: its deadline passed {late} ms before a worker reached it (the client has "
                "given up)", b"")
        commit(rec, sync=False)
        return
    t0 = time.monotonic()
    try:
        reply = _handle(handler, msg, retries, stop_event)
        with lock:
            stats["handled"] += 1
    except Exception as exc:  # a handler failure must become an answer, not a dead worker
        with lock:
            stats["errors"] += 1
        log.warning("handler failed on %s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, exc, exc_info=True)
        reply = on_error(msg, exc) if header is not None else None
        if reply is None:
            dead_letter_record(bus, rec, f"handler: {type(exc).__name__}: {exc}")
    if reply is not None and header is not None and header.reply_topic:
        if hasattr(reply, "request_id") and not reply.request_id:
            reply.request_id = header.request_id
        _send_reply(bus, producer, rec, header, reply)
    elif reply is not None:
        dead_letter_record(bus, rec, f"request without a reply address (header.reply_topic is empty): its "
                f"{type(reply).__name__} had nowhere to go")
    log.debug("handled %s in %.1f ms", type(msg).__name__, (time.monotonic() - t0) * 1000)
    # After the reply is acked: at-least-once. A short job commits asynchronously (latency); a long one waits
    # for the ack, which fences a member the group dropped during the job (frozen, partitioned) before it
    # polls the next request: kafka-python's heartbeat may not have told it yet.
    commit(rec, sync=time.monotonic() - t0 > 0.1)


def _send_reply(bus, producer, rec, header, reply) -> None:
    """Send the reply and wait for its ack; a reply the broker will never take (no such topic or partition,
    too large) dead-letters the request with the reason. A transient failure propagates: the request stays
    uncommitted and is served again."""
    from schemas import topics

    replies = bus.topic(topics.TOOL_REPLIES)
    if header.reply_topic not in (replies, topics.TOOL_REPLIES):
        # a reply is only ever sent to this cluster's replies topic, never where a record says
        dead_letter_record(bus, rec, f"reply_topic {header.reply_topic!r} is not this cluster's replies topic {replies!r}")
        return
    try:
        producer.send(header.reply_topic, reply, key=header.sender or None,
                      partition=header.reply_partition).get(timeout=60)
    except Exception as exc:  # sorted by is_retriable: transient ones re-raise
        if is_retriable(exc):
            raise
        dead_letter_record(bus, rec, f"reply undeliverable to {header.reply_topic!r}[{header.reply_partition}]: "
                f"{type(exc).__name__}: {exc}")


def dead_letter_record(bus, rec, why: str, payload: bytes | None = None) -> None:
    """Dead-letter the consumed record ``rec`` with its reason (and, by default, the record itself)."""
    bus.dead_letter(rec.raw_topic, rec.partition, rec.offset, why, _reencode(rec.msg) if payload is None else payload,
                    rec.key.encode() if rec.key else None)


def _reencode(msg) -> bytes:
    from schemas import codec

    try:
        return codec.encode(msg)
    except codec.SchemaError:
        return b""
