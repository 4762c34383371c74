"""Lossless delta codec of the "buckets" layout: a bucket as XOR against the previous version's, compressed.

A training step moves each weight by a tiny fraction of its value, so its sign, exponent and top mantissa
bits stay put: the XOR of a bucket with the same bucket of the previous version is mostly zero bytes in those
positions. Grouping each element's byte k with every other element's byte k ("byte planes", per tensor, by
its dtype's width) puts those zeros next to each other, and zstd level 1 squeezes them out. Measured on a
100M float32 vector with an Adam-like step (lr 1e-5): XOR + zstd 1.54x, XOR + planes + zstd 1.85x (lz4 1.66x,
zlib-1 1.81x at a fifth of zstd's speed); bfloat16 7.2x / 8.6x (docs/weights-bench.md). Only XOR + planes +
zstd-1 is written (``CODEC``); ``encode(shuffle=False)`` exists for that comparison.

Delta or full, per bucket: a bucket is encoded only when its safetensors header is byte-identical to the base
bucket's (same names, dtypes, shapes and offsets: then the byte positions line up), otherwise it is sent whole.
The decoded bytes are checked against the full bucket's announced hash by the caller, so a wrong base, a corrupt
delta or a codec bug can never be loaded.

Why every version still carries its full buckets (cluster.weights.buckets sends the delta section in addition,
learner.weight_compression = "xor-delta"): an actor decodes a delta only when it holds exactly the base
version's buckets; one that joined late, skipped a version (it applies the newest announced) or failed one
reads the full buckets of the same announcement instead. No version depends on another version's chunks still
being in the log (retention) and no receiver waits for a keyframe or replays a chain: a version is never lost
and nothing can get stuck. The price is on the learner's side (it sends full + delta, about 1.1-1.5x the bytes
of "none"); every actor that holds the base reads only the delta. Keyframes every K versions + delta chains
would also save the learner's bytes, at the cost of chains, retention coupling and late-joiner waits.
"""
from __future__ import annotations

import json
import logging
import struct

import numpy as np

from cluster.errors import ConfigError
from cluster.weights.fs import WeightsCorrupt

log = logging.getLogger(__name__)

CHOICES = ("none", "xor-delta")  # learner.weight_compression
CODEC = "xor-planes-zstd1"  # what an announcement's delta_codec names: XOR, byte planes per tensor, zstd level 1
PLAIN = "xor-zstd1"  # XOR + zstd without byte planes: decodable, written only by the benchmark's comparison
_WIDTH = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}
_MAX_HEADER = 100 << 20  # safetensors' own limit on a header


def header(data: bytes) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A safetensors bucket's header bytes and its tensors' (begin, end, element width) in absolute offsets."""
    if len(data) < 8:
        raise WeightsCorrupt("a weight bucket is shorter than a safetensors header")
    n = struct.unpack("<Q", data[:8])[0]
    if n > min(_MAX_HEADER, len(data) - 8):
        raise WeightsCorrupt(f"a weight bucket's safetensors header claims {n} bytes")
    raw = bytes(data[:8 + n])
    try:
        meta = json.loads(raw[8:])
    except ValueError as exc:
        raise WeightsCorrupt(f"a weight bucket's safetensors header is not JSON: {exc}") from None
    spans = []
    for name, t in meta.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        spans.append((8 + n + begin, 8 + n + end, _WIDTH.get(t["dtype"], 1)))
    return raw, sorted(spans)


def _planes(x: np.ndarray, spans, forward: bool) -> np.ndarray:
    """A copy of ``x`` with byte k of every element of each tensor together (forward), or back in element order."""
    out = np.empty_like(x)
    done = 0
    for begin, end, width in spans:
        out[done:begin] = x[done:begin]  # the header, alignment padding
        seg = x[begin:end]
        if width == 1 or (end - begin) % width:
            out[begin:end] = seg  # one-byte dtypes have a single plane; a ragged span is left as it is
        else:  # one strided copy per plane: several times faster than a transposed copy of the whole span
            n, dst = (end - begin) // width, out[begin:end]
            for k in range(width):
                if forward:
                    dst[k * n:(k + 1) * n] = seg[k::width]
                else:
                    dst[k::width] = seg[k * n:(k + 1) * n]
        done = max(done, end)
    out[done:] = x[done:]
    return out


def _xor(a: bytes, b: bytes) -> np.ndarray:
    return np.bitwise_xor(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8))


def encode(new: bytes, base: bytes, shuffle: bool = True, level: int = 1) -> bytes | None:
    """``new`` as a delta against ``base`` (``CODEC``; ``PLAIN`` without shuffle), or None when their headers
    differ (other tensors, dtypes or shapes): then the bucket is sent whole."""
    import zstandard

    if len(new) != len(base):
        return None
    head, spans = header(new)
    if bytes(base[:len(head)]) != head:
        return None
    x = _xor(new, base)
    if shuffle:
        x = _planes(x, spans, forward=True)
    return zstandard.ZstdCompressor(level=level).compress(x.data)


def decode(delta: bytes, base: bytes, codec: str = CODEC) -> bytes:
    """The bucket ``delta`` encodes against ``base``; the caller checks it against the announced hash."""
    import zstandard

    if codec not in (CODEC, PLAIN):
        raise WeightsCorrupt(f"unknown weight delta codec {codec!r} (this kernelrl reads {CODEC!r}, {PLAIN!r})")
    try:
        x = np.frombuffer(zstandard.ZstdDecompressor().decompress(delta, max_output_size=len(base)), np.uint8)
    except zstandard.ZstdError as exc:
        raise WeightsCorrupt(f"a weight delta does not decompress: {exc}") from None
    if len(x) != len(base):
        raise WeightsCorrupt(f"a weight delta decodes to {len(x)} bytes against a base of {len(base)}")
    # the header's bytes XOR to zero, so the planes' layout is the base's own
    x = _planes(x, header(base)[1], forward=False) if codec == CODEC else x.copy()
    return np.bitwise_xor(x, np.frombuffer(base, np.uint8), out=x).tobytes()


class DeltaEncoder:
    """The learner's side: the buckets it last published (one version's bytes, replaced bucket by bucket) and
    which version they are; ``entry`` gives each new bucket's delta against them."""

    def __init__(self, shuffle: bool = True) -> None:
        self.codec = CODEC if shuffle else PLAIN
        self.shuffle = shuffle
        self.version: int | None = None  # None: no complete version held (none yet, or one failed part-way)
        self.held: list[bytes] = []
        self._base: int | None = None

    def begin(self) -> None:
        """A new version starts: its buckets replace the held ones as they come, so the held set is mixed
        until ``commit``."""
        self._base, self.version = self.version, None

    def entry(self, i: int, data: bytes) -> tuple[int, bytes]:
        """(base version, delta) for bucket ``i``, or (-1, data) when it must go whole."""
        base = self.held[i] if self._base is not None and i < len(self.held) else None
        if i < len(self.held):
            self.held[i] = data
        else:
            self.held.append(data)
        enc = encode(data, base, self.shuffle) if base is not None else None
        return (self._base, enc) if enc is not None else (-1, data)

    def commit(self, version: int, count: int) -> None:
        """Every bucket of ``version`` is out (acknowledged): it is the base of the next one."""
        del self.held[count:]
        self.version = version


def encoder_for(compression: str) -> DeltaEncoder | None:
    """The learner's encoder for learner.weight_compression (None for "none")."""
    if compression == "none":
        return None
    if compression == "xor-delta":
        return DeltaEncoder()
    raise ConfigError(f"learner.weight_compression: {compression!r} is not one of {list(CHOICES)}")
