"""The digest algorithms that check a policy version's bytes: "blake3" for new versions, "sha256" for older ones.

A WeightAnnouncement names the algorithm of all its hashes (``digest``; an announcement or manifest without one
is "sha256", what every version carried before). blake3 runs at ~5.4 GB/s on one core (sha256: ~1.4 GB/s, which
bounded an in-memory publish on a GPU host) and spreads a large buffer over the cores: ``hexdigest`` does so from
``THREADED_MIN`` bytes (on a 2-core box, threads lost below 64 KB and won from 1 MB), a streaming ``hasher``
always (its updates are file blocks and chunks of megabytes).
"""
from __future__ import annotations

import hashlib
from typing import Protocol

from cluster.errors import SetupError

BLAKE3 = "blake3"
SHA256 = "sha256"
DEFAULT = BLAKE3  # what publishers write
ALGORITHMS = (BLAKE3, SHA256)
THREADED_MIN = 1 << 20  # blake3 buffers from this size are hashed on all cores


class Hasher(Protocol):
    def update(self, data, /) -> object: ...

    def hexdigest(self) -> str: ...


def check(alg: str) -> str:
    """``alg`` if it is a known digest algorithm, else ValueError naming it and the known ones."""
    if alg not in ALGORITHMS:
        raise ValueError(f"unknown weight digest algorithm {alg!r}: expected one of {', '.join(ALGORITHMS)}")
    return alg


def _blake3():
    try:
        import blake3
    except ImportError as exc:
        raise SetupError("weight digests: the blake3 module is missing; install it (pip install 'blake3>=1.0', "
                         "a kernelrl dependency)") from exc
    return blake3.blake3


def hasher(alg: str) -> Hasher:
    """A streaming hasher (update(), hexdigest()) of ``alg``; a blake3 one uses every core."""
    if check(alg) == SHA256:
        return hashlib.sha256()
    b3 = _blake3()
    return b3(max_threads=b3.AUTO)


def hexdigest(alg: str, data) -> str:
    """The ``alg`` digest of a bytes-like ``data`` as hex; a blake3 one of ``THREADED_MIN`` bytes or more uses every
    core."""
    if check(alg) == SHA256:
        return hashlib.sha256(data).hexdigest()
    b3 = _blake3()
    threads = b3.AUTO if memoryview(data).nbytes >= THREADED_MIN else 1
    return b3(data, max_threads=threads).hexdigest()
