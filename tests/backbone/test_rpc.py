"""Request/reply on the real broker: replies, timeouts, retries, duplicates, late and stale replies."""
from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest
import uvloop

from cluster.bus.client import AsyncRequestClient, Bus, RequestClient, RequestTimeout, serve
from schemas import topics as T
from schemas.messages import CompileRequest, CompileResult, DeadLetter, RequestHeader, Task
from tests.backbone.test_bus import _wait, dead_letters


def req(episode="ep", **kw) -> CompileRequest:
    return CompileRequest(header=RequestHeader(), episode_id=episode, files={"model_new.py": "x = 1\n"}, **kw)


def ok(msg) -> CompileResult:
    return CompileResult(request_id=msg.header.request_id, episode_id=msg.episode_id, ok=True,
                         log=f"attempt {msg.header.attempt}")


@contextlib.contextmanager
def worker(bus, handler, topic=T.TOOL_COMPILE, group="compile-workers", **kw):
    """serve() on a thread, ready (partitions assigned) before the block runs."""
    stop, ready, out = threading.Event(), threading.Event(), {}

    def run():
        out["stats"] = serve(bus, topic, group, handler, stop, on_ready=ready.set, **kw)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    assert ready.wait(30), "worker never got its partitions"
    try:
        yield out
    finally:
        stop.set()
        th.join(15)
        assert not th.is_alive(), "serve() did not stop on stop_event"


def test_request_gets_its_reply_and_the_worker_commits(cfg):
    with Bus(cfg, client_id="rr") as bus, worker(bus, ok) as w, RequestClient(bus, "actor-0") as client:
        replies = [client.request(T.TOOL_COMPILE, req(f"ep{i}"), timeout_s=10) for i in range(5)]
        assert [r.episode_id for r in replies] == [f"ep{i}" for i in range(5)]
        assert all(r.ok and r.log == "attempt 0" for r in replies)
        assert client.stats["replies"] == 5 and client.stats["timeouts"] == 0
    assert w["stats"]["handled"] == 5
    with Bus(cfg) as bus:
        assert bus.lag("compile-workers", [T.TOOL_COMPILE]) == {T.TOOL_COMPILE: 0}


def test_timeout_then_retry_succeeds_and_the_slow_reply_is_a_duplicate(cfg):
    def slow_first(msg):
        if msg.header.attempt == 0:
            time.sleep(1.5)
        return ok(msg)

    with Bus(cfg) as bus, worker(bus, slow_first), RequestClient(bus, "actor-1") as client:
        t0 = time.monotonic()
        reply = client.request(T.TOOL_COMPILE, req(), timeout_s=0.5, retries=3, backoff_s=0.05)
        assert reply.ok and time.monotonic() - t0 >= 0.5
        assert client.stats["timeouts"] >= 1 and client.stats["retries"] >= 1
        # both attempts share the request id: the first reply answers, the other is dropped
        _wait(lambda: client.stats["duplicates"] >= 1, 10, "the second reply to be dropped as a duplicate")
        assert client.stats["replies"] == 1


def test_no_worker_times_out_after_bounded_retries_and_expired_requests_are_skipped(cfg):
    with Bus(cfg) as bus:
        with RequestClient(bus, "actor-2") as client:
            t0 = time.monotonic()
            with pytest.raises(RequestTimeout, match=r"after 3 attempt\(s\)"):
                client.request(T.TOOL_COMPILE, req(), timeout_s=0.3, retries=2, backoff_s=0.05)
            elapsed = time.monotonic() - t0
            assert 0.9 <= elapsed < 5 and client.stats["timeouts"] == 3 and client.stats["retries"] == 2
        # a worker that starts later finds three expired requests: skipped, committed, never handled
        calls = []
        with worker(bus, lambda m: calls.append(m) or ok(m)):
            _wait(lambda: bus.lag("compile-workers", [T.TOOL_COMPILE])[T.TOOL_COMPILE] == 0, 20,
                  "expired requests to be committed")
        assert calls == []


def test_late_reply_after_giving_up_is_dropped(cfg):
    def slow(msg):
        time.sleep(1.0)
        return ok(msg)

    with Bus(cfg) as bus, worker(bus, slow), RequestClient(bus, "actor-3") as client:
        with pytest.raises(RequestTimeout):
            client.request(T.TOOL_COMPILE, req(), timeout_s=0.3, retries=0)
        _wait(lambda: client.stats["late"] == 1, 10, "the late reply")
        assert client.stats["replies"] == 0
        # the client still works afterwards
        assert client.request(T.TOOL_COMPILE, req("after"), timeout_s=10).episode_id == "after"


def test_duplicate_and_stale_replies_are_dropped(cfg):
    with Bus(cfg) as bus, RequestClient(bus, "actor-4") as client:
        extra = bus.producer(linger_ms=0)

        def twice(msg):
            reply = ok(msg)
            extra.send(msg.header.reply_topic, reply, partition=msg.header.reply_partition).get(10)
            return reply

        # a stale reply for a request id nobody waits for
        extra.send(T.TOOL_REPLIES, CompileResult(request_id="old", episode_id="e", ok=True),
                   partition=client.partition).get(10)
        with worker(bus, twice):
            reply = client.request(T.TOOL_COMPILE, req(), timeout_s=10)
            assert reply.ok
            _wait(lambda: client.stats["duplicates"] == 1 and client.stats["stale"] == 1, 10, "drops")
        assert client.stats["replies"] == 1
        extra.close()


def test_handler_error_becomes_an_error_reply_and_non_requests_go_to_the_dlq(cfg):
    def boom(msg):
        raise ValueError(f"cannot build {msg.episode_id}")

    with Bus(cfg) as bus:
        with worker(bus, boom) as w, RequestClient(bus, "actor-5") as client:
            reply = client.request(T.TOOL_COMPILE, req("bad"), timeout_s=10)
        assert reply.ok is False and reply.error == "ValueError: cannot build bad"
        assert w["stats"]["errors"] == 1
        prod = bus.producer()
        prod.send(T.TASKS, Task(task_id="t1", model_py="m"), key="t1").get(10)
        prod.close()

        def no_task(msg):
            raise RuntimeError("nope")

        with worker(bus, no_task, topic=T.TASKS, group="feeders"):
            (letter,) = dead_letters(bus, 1)
        assert isinstance(letter, DeadLetter) and letter.error == "handler: RuntimeError: nope"
        assert letter.source_topic == cfg.topic(T.TASKS)


def test_async_client_concurrent_requests_on_uvloop(cfg):
    def echo(msg):
        time.sleep(0.01)
        return ok(msg)

    async def main(client):
        reqs = [client.request(T.TOOL_COMPILE, req(f"ep{i}"), timeout_s=20) for i in range(20)]
        ticks = 0

        async def ticker():  # the loop stays responsive while requests are in flight
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1

        t = asyncio.ensure_future(ticker())
        replies = await asyncio.gather(*reqs)
        t.cancel()
        return replies, ticks

    with Bus(cfg) as bus, worker(bus, echo):
        client = AsyncRequestClient(bus, "actor-async")
        try:
            replies, ticks = uvloop.run(main(client))
        finally:
            client.close()
    assert [r.episode_id for r in replies] == [f"ep{i}" for i in range(20)]
    assert ticks >= 10


def test_poisoned_request_topic_every_record_is_answered_or_dead_lettered(cfg):
    """A drill on the real broker: malformed records of every kind between valid requests. Every valid request
    gets its reply, every other record one dead letter with its reason, and the worker serves on."""
    import msgpack

    from cluster.bus.scan import committed_offsets, read_topic
    from cluster.launch.report import durable_invariants
    from schemas import codec
    from schemas.messages import now_ms

    def raw(body):
        return msgpack.packb(body, use_bin_type=True)

    good = codec.encode(req("valid"))
    body = msgpack.unpackb(good, raw=False)
    future = dict(body, v=99)
    future.pop("r")
    with Bus(cfg) as bus, RequestClient(bus, "actor-drill") as client:
        def valid(eid):
            h = RequestHeader(request_id=f"rid-{eid}", reply_topic=client.reply_topic,
                              reply_partition=client.partition, sender="actor-drill")
            return CompileRequest(header=h, episode_id=eid, files={"model_new.py": "x = 1\n"})

        poison = {
            "random bytes": b"\x93\xff\x00garbage",
            "wrong kind": codec.encode(Task(task_id="t", model_py="m")),
            "missing field": raw(dict(body, d={k: v for k, v in body["d"].items() if k != "episode_id"})),
            "version 0": raw(dict(body, v=0)),
            "version 99": raw(future),
            "no reply address": codec.encode(CompileRequest(header=RequestHeader(), episode_id="nowhere", files={})),
            "foreign reply topic": codec.encode(CompileRequest(header=RequestHeader(reply_topic="elsewhere"),
                                                               episode_id="foreign", files={})),
            "bad reply partition": codec.encode(CompileRequest(
                header=RequestHeader(reply_topic=client.reply_topic, reply_partition=999), episode_id="p999", files={})),
            "expired": codec.encode(CompileRequest(header=RequestHeader(reply_topic=client.reply_topic,
                                                                        deadline_ms=now_ms() - 60_000),
                                                   episode_id="late", files={})),
        }
        prod = bus.producer()
        for i, (_name, payload) in enumerate(poison.items()):
            prod.send(T.TOOL_COMPILE, valid(f"v{i}"), key="k", partition=0).get(10)
            prod.send_bytes(T.TOOL_COMPILE, payload, key="k", partition=0).get(10)
        prod.send(T.TOOL_COMPILE, valid("last"), key="k", partition=0).get(10)
        prod.close()
        with worker(bus, ok, expected=CompileRequest):  # as the compile workers serve
            letters = dead_letters(bus, len(poison), timeout_s=60)
            seen = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                seen.append(committed_offsets(bus, bus.group("compile-workers"), T.TOOL_COMPILE).get(0))
                if seen[-1] == 2 * len(poison) + 1:
                    break
                time.sleep(0.2)
            assert seen[-1] == 2 * len(poison) + 1, f"not every record committed: {seen[-3:]}"
        replies = {r.msg.episode_id for r in read_topic(bus, T.TOOL_REPLIES) if isinstance(r.msg, CompileResult)}
        rep = durable_invariants(bus, bus.group("actors"))  # what `kernelrl up`'s report counts from the topics
    assert (rep["tool_calls_sent"], rep["tool_calls_lost"], rep["tool_calls_dead_lettered"]) == (len(poison) + 5, 0, 4)
    assert replies == {f"v{i}" for i in range(len(poison))} | {"last"}
    assert len(letters) == len(poison) and len({x.offset for x in letters}) == len(poison)
    reasons = "\n".join(sorted(x.error for x in letters))
    for words in ("undecodable", "unexpected message kind 'task'", "episode_id", "bad schema version 0",
                  "newer than this kernelrl reads", "without a reply address", "not this cluster's replies topic",
                  "reply undeliverable", "expired"):
        assert words in reasons, (words, reasons)


def test_concurrent_worker_answers_behind_a_slow_request_and_commits_in_order(cfg):
    """serve(concurrency=2), as `compile-worker --jobs 2`: a quick request queued behind a slow one on the same
    partition is answered while the slow one runs, and nothing is committed past the unfinished slow request
    (a crash then would redeliver both); once it finishes, everything is."""
    started, release = threading.Event(), threading.Event()

    def handler(msg):
        if msg.episode_id == "slow":
            started.set()
            assert release.wait(30)
        return ok(msg)

    def lag(bus):
        return bus.lag(bus.group("compile-workers"), [T.TOOL_COMPILE])[T.TOOL_COMPILE]

    with Bus(cfg) as bus, worker(bus, handler, concurrency=2) as w, RequestClient(bus, "actor-pool") as client:
        out = {}
        th = threading.Thread(target=lambda: out.update(slow=client.request(T.TOOL_COMPILE, req("slow"), timeout_s=60,
                                                                             retries=0, key="same")))
        th.start()
        assert started.wait(20), "the slow request never reached the handler"
        fast = client.request(T.TOOL_COMPILE, req("fast"), timeout_s=20, retries=0, key="same")
        assert fast.ok and fast.episode_id == "fast" and not release.is_set()
        time.sleep(1.0)  # commits of finished requests happen between polls
        assert lag(bus) == 2, "a commit went past the unfinished slow request"
        release.set()
        th.join(30)
        assert out["slow"].ok and out["slow"].episode_id == "slow"
        _wait(lambda: lag(bus) == 0, 15, "both requests to be committed")
    assert w["stats"]["handled"] == 2 and w["stats"]["errors"] == 0
