"""The retry helpers read `retriable`: ours, kafka-python's, and lost connections; others fail at once."""
from __future__ import annotations

import asyncio
import threading

import pytest
from kafka.errors import (CoordinatorNotAvailableError, KafkaTimeoutError, MessageSizeTooLargeError,
                          TopicAuthorizationFailedError)

from cluster.config import ConfigError
from cluster.errors import RetriableError, is_retriable, retry, retry_async


def test_is_retriable_reads_the_flag():
    assert is_retriable(RetriableError("x")) and is_retriable(CoordinatorNotAvailableError())
    assert is_retriable(ConnectionResetError()) and is_retriable(TimeoutError())
    assert not is_retriable(TopicAuthorizationFailedError()) and not is_retriable(ConfigError("x"))
    assert not is_retriable(ValueError("x"))


def test_retry_retries_only_what_can_succeed():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise CoordinatorNotAvailableError()
        return "ok"

    assert retry(flaky, "flaky", backoff_s=0.001) == "ok" and len(calls) == 3

    def denied():
        calls.append(1)
        raise TopicAuthorizationFailedError()

    calls.clear()
    with pytest.raises(TopicAuthorizationFailedError):
        retry(denied, "denied", backoff_s=0.001)
    assert len(calls) == 1  # no retry of an error that says a retry cannot help

    def always():
        calls.append(1)
        raise RetriableError("down")

    calls.clear()
    with pytest.raises(RetriableError):
        retry(always, "always", attempts=3, backoff_s=0.001)
    assert len(calls) == 3


def _failing(errors):
    """A call raising ``errors`` in turn, then returning 'ok'; ``calls`` counts the attempts."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return call, calls


def test_retriable_errors_are_retried_with_doubling_back_off(monkeypatch):
    from cluster import errors

    slept = []
    monkeypatch.setattr(errors.time, "sleep", slept.append)
    call, calls = _failing([KafkaTimeoutError(), RetriableError("down"), ConnectionResetError(), TimeoutError()])
    assert retry(call, "flaky", attempts=5, backoff_s=0.5, max_backoff_s=2.0) == "ok"
    assert len(calls) == 5 and slept == [0.5, 1.0, 2.0, 2.0]


def test_a_non_retriable_error_is_raised_at_once_with_its_message(monkeypatch):
    from cluster import errors

    slept = []
    monkeypatch.setattr(errors.time, "sleep", slept.append)
    call, calls = _failing([MessageSizeTooLargeError("record of 9 MB")])
    with pytest.raises(MessageSizeTooLargeError, match="record of 9 MB") as info:
        retry(call, "publishing x")
    assert len(calls) == 1 and slept == []
    assert any("publishing x: not retried" in n for n in info.value.__notes__)


def test_bus_error_takes_the_flag_of_the_kafka_error_it_wraps():
    from cluster.bus.client import BusError

    assert not is_retriable(BusError("delivery failed", MessageSizeTooLargeError()))
    assert is_retriable(BusError("delivery failed", KafkaTimeoutError()))
    assert is_retriable(BusError("broker away"))  # no cause: a bus failure is transient by default


def test_a_set_stop_event_ends_the_retries():
    stop = threading.Event()
    stop.set()
    call, calls = _failing([RetriableError("down")] * 3)
    with pytest.raises(RetriableError):
        retry(call, "stopping", backoff_s=10.0, stop=stop)
    assert len(calls) == 1


def test_the_async_twin_follows_the_same_rules():
    async def flaky_then_ok():
        return sync()

    sync, calls = _failing([KafkaTimeoutError(), KafkaTimeoutError()])
    assert asyncio.run(retry_async(flaky_then_ok, "flaky", backoff_s=0.001)) == "ok" and len(calls) == 3
    sync, calls = _failing([TopicAuthorizationFailedError()])
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(retry_async(flaky_then_ok, "denied", backoff_s=0.001))
    assert len(calls) == 1
