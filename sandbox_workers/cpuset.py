"""CPU cores for the CPU backend's evaluations: the CPU analogue of pinning an evaluation worker to one GPU.

Two evaluations timed on the same cores slow each other's OpenMP pools by whole scheduler slices (a
parallel-for waits for its slowest thread), so concurrent CPU evaluations each get their own cores. The
children (judge, candidate, baseline) inherit the pinning of the thread that starts them.
"""
from __future__ import annotations

import logging
import os

from cluster.errors import ConfigError

log = logging.getLogger(__name__)


def parse(spec: str) -> list[int]:
    """A Linux CPU list ("0-3,8,10-11") as sorted core ids; every id must be one this process may use."""
    cores: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(f"sandbox.cpu_cores: {spec!r} is not a CPU list (e.g. \"0-3,8\")") from None
        if a < 0 or b < a:
            raise ConfigError(f"sandbox.cpu_cores: bad range {part!r} in {spec!r}")
        cores.update(range(a, b + 1))
    allowed = available()
    missing = sorted(cores - set(allowed))
    if missing:
        raise ConfigError(f"sandbox.cpu_cores: cores {missing} of {spec!r} are not available here (allowed: "
                          f"{format_list(allowed)})")
    if not cores:
        raise ConfigError(f"sandbox.cpu_cores: {spec!r} names no core")
    return sorted(cores)


def available() -> list[int]:
    """The cores the calling thread may run on."""
    return sorted(os.sched_getaffinity(0))


def format_list(cores: list[int]) -> str:
    out, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


def split(cores: list[int], n: int) -> list[list[int]]:
    """``n`` disjoint, contiguous slices of ``cores`` as even as possible; with more slices than cores the
    slices share cores round-robin (timings then contend, which is logged)."""
    n = max(1, n)
    if n > len(cores):
        log.warning("%d concurrent CPU evaluations on %d cores: they share cores and their timings contend",
                    n, len(cores))
        return [[cores[i % len(cores)]] for i in range(n)]
    q, r = divmod(len(cores), n)
    out, at = [], 0
    for i in range(n):
        k = q + (1 if i < r else 0)
        out.append(cores[at:at + k])
        at += k
    return out


def pin(cores: list[int]) -> None:
    """Pin the calling thread (and so every process it starts from now on) to ``cores``."""
    os.sched_setaffinity(0, cores)
    log.debug("pinned to cores %s", format_list(cores))


def threads(configured: int) -> int:
    """Threads an evaluation uses: the configured count, else every core the calling thread may use."""
    return configured if configured > 0 else len(available())
