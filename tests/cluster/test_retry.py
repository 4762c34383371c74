"""The retry helper reads `retriable`: ours, kafka-python's, and lost connections; others fail at once."""
from __future__ import annotations

import pytest
from kafka.errors import CoordinatorNotAvailableError, TopicAuthorizationFailedError

from cluster.config import ConfigError
from cluster.errors import RetriableError, is_retriable, retry


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
