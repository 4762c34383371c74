"""Process helpers shared by the broker launcher and the role supervisor."""
from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when the process that started it dies, even by
    SIGKILL (Linux prctl), so a killed `kernelrl up` or test session leaves no orphans."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
