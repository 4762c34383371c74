"""Error base classes shared by every role (each says whether a retry can help), and the retry helper.

Every retry loop goes through ``retry``/``retry_async`` or asks ``is_retriable``, which
reads ``retriable`` (ours and kafka-python's): a non-retriable error fails at once. The
CLI prints ``user_facing`` errors without a traceback.
"""
from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration value is missing, malformed or out of range."""

    retriable = False


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


class DivergedError(KernelRLError):
    """Training produced non-finite gradients: the weights of that step are not published or checkpointed."""


def is_retriable(exc: BaseException) -> bool:
    """Whether trying again can help: our errors' and kafka-python's ``retriable`` flag, and lost connections."""
    flag = getattr(exc, "retriable", None)
    if flag is not None:
        return bool(flag)
    return isinstance(exc, (ConnectionError, TimeoutError))


def _give_up(exc: BaseException, what: str, attempt: int, attempts: int) -> bool:
    """True (with a note on ``exc`` saying why) when ``exc`` ends the retries; False when another try is due."""
    if not is_retriable(exc):
        exc.add_note(f"{what}: not retried: {type(exc).__name__} is not retriable (a retry cannot help)")
        return True
    if attempt >= attempts:
        exc.add_note(f"{what}: gave up after {attempts} attempt(s)")
        return True
    return False


def _delays(backoff_s: float, max_backoff_s: float):
    delay = backoff_s
    while True:
        yield delay
        delay = min(delay * 2, max_backoff_s)


def retry(call, what: str, attempts: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 8.0, stop=None):
    """``call()`` until it returns, retrying only errors that say a retry can help (``is_retriable``), with
    doubling back-off; a non-retriable error, the last attempt's, or any once ``stop`` (a threading.Event)
    is set, propagates at once, unchanged but for a note saying why it was not retried."""
    delays = _delays(backoff_s, max_backoff_s)
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:  # sorted by is_retriable: the others re-raise unchanged
            if _give_up(exc, what, attempt, attempts) or (stop is not None and stop.is_set()):
                raise
            delay = next(delays)
            log.warning("%s failed (%s: %s); retry %d/%d in %.1f s", what, type(exc).__name__, exc, attempt,
                        attempts - 1, delay)
            if stop is not None and stop.wait(delay):
                raise
            if stop is None:
                time.sleep(delay)
    raise AssertionError("unreachable")


async def retry_async(call, what: str, attempts: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 8.0):
    """The asyncio twin of ``retry``: ``await call()`` with the same rules, sleeping without blocking the loop."""
    delays = _delays(backoff_s, max_backoff_s)
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception as exc:  # sorted by is_retriable: the others re-raise unchanged
            if _give_up(exc, what, attempt, attempts):
                raise
            delay = next(delays)
            log.warning("%s failed (%s: %s); retry %d/%d in %.1f s", what, type(exc).__name__, exc, attempt,
                        attempts - 1, delay)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")
