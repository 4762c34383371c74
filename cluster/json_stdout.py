"""`--json`: the command's JSON is the only thing on stdout; everything else goes to stderr.

A library's own output cannot be trusted to stay off stdout (DeepSpeed prints its op-build lines with
``print``; ninja and compilers write to the inherited file descriptor 1), so while a ``--json`` command
runs, both ``sys.stdout`` and file descriptor 1 point at stderr, and the command hands its document to
``emit``, which writes to the saved real stdout. Commands without ``--json`` are left alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Iterator

_real: Any = None  # the saved stdout while a --json command runs


@contextlib.contextmanager
def json_only(enabled: bool) -> Iterator[None]:
    global _real
    if not enabled or _real is not None:
        yield
        return
    sys.stdout.flush()
    saved_fd = os.dup(1)
    saved_stdout = sys.stdout
    _real = os.fdopen(os.dup(saved_fd), "w", encoding="utf-8")
    os.dup2(2, 1)  # children and C code that write to fd 1 land on stderr
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stderr.flush()
        _real.flush()
        _real.close()
        _real = None
        os.dup2(saved_fd, 1)
        os.close(saved_fd)
        sys.stdout = saved_stdout


def emit(obj: Any, indent: int | None = None) -> str:
    """Print ``obj`` as JSON on the real stdout (the only stdout line of a --json run); returns the text."""
    text = json.dumps(obj, indent=indent, default=str)
    stream = _real if _real is not None else sys.stdout
    stream.write(text + "\n")
    stream.flush()
    return text


def wants_json(args: Any) -> bool:
    """``--json`` given to the command (for `bench`, also after its target, where it lands in ``rest``)."""
    return bool(getattr(args, "json", False)) or "--json" in (getattr(args, "rest", None) or [])
