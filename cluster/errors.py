"""Error base classes shared by every role: each says whether a retry can help.

Retry loops read ``retriable``; the CLI prints ``user_facing`` errors without a
traceback.
"""
from __future__ import annotations


class KernelRLError(Exception):
    """Base of kernelrl's own errors."""

    retriable = False
    user_facing = True


class RetriableError(KernelRLError):
    """A transient failure: the same call may succeed later."""

    retriable = True


class SetupError(KernelRLError):
    """Something the machine lacks (Java, Maven, a toolchain): the message says what to install."""
