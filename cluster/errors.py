"""Error base classes shared by every role: each says whether a retry can help.

Retry loops read ``retriable``; the CLI prints ``user_facing`` errors without a
traceback.
"""
from __future__ import annotations


class KernelRLError(Exception):
    """Base of kernelrl's own errors."""

    retriable = False
    user_facing = True
    exit_code = 1  # what the CLI exits with when this ends a command


class RetriableError(KernelRLError):
    """A transient failure: the same call may succeed later."""

    retriable = True


class InputError(KernelRLError):
    """Something the user passed (a file, a folder, an option) is missing or malformed: exit 2, like a
    config error; the message names the argument and what was wrong with it."""

    exit_code = 2


class SetupError(KernelRLError):
    """Something the machine lacks (Java, Maven, a toolchain): the message says what to install."""


def is_retriable(exc: BaseException) -> bool:
    """Whether trying again can help: our errors' and kafka-python's ``retriable`` flag, and lost connections."""
    flag = getattr(exc, "retriable", None)
    if flag is not None:
        return bool(flag)
    return isinstance(exc, (ConnectionError, TimeoutError))


def retry(call, what: str, attempts: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 8.0):
    """``call()`` until it returns, retrying only errors that say a retry can help (``is_retriable``), with
    doubling back-off; a non-retriable error, or the last attempt's, propagates at once."""
    import logging
    import time

    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - sorted by is_retriable: the others re-raise unchanged
            if attempt == attempts or not is_retriable(exc):
                raise
            logging.getLogger(__name__).warning("%s failed (%s: %s); retry %d/%d in %.1f s", what,
                                                type(exc).__name__, exc, attempt, attempts - 1, delay)
            time.sleep(delay)
            delay = min(delay * 2, max_backoff_s)
    raise AssertionError("unreachable")
