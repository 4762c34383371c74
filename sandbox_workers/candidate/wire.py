"""The judge <-> remote wire: length-prefixed JSON messages over pipes, tensors in a shared file.

Both ends import this module: the trusted judge and the sandboxed process that runs a model
(the candidate, or the reference for the baselines). It imports only the standard library
and torch, so it runs inside the sandbox where nothing else of kernelrl is visible.

Everything read from the other end is validated here: a message is one JSON object of at
most MAX_MESSAGE bytes, a tensor descriptor must lie inside the region it was given, with a
known dtype and a size that matches its shape. The judge treats a ProtocolError from the
candidate's side as the candidate's failure.
"""
from __future__ import annotations

import ctypes
import json
import math
import mmap
import os
import select
import struct
import time

import torch

MAX_MESSAGE = 8 << 20
ALIGN = 64
MAX_DIMS = 16
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
    torch.int32, torch.int64, torch.bool, torch.complex64)}


class ProtocolError(RuntimeError):
    """The other end sent something malformed, closed the pipe, or did not answer in time."""

    retriable = False


class PeerTimeout(ProtocolError):
    """No answer before the deadline."""


class PeerGone(ProtocolError):
    """The other end closed its pipe (it exited or crashed)."""


class Channel:
    """One duplex link made of two pipe ends."""

    def __init__(self, rfd: int, wfd: int):
        self.rfd, self.wfd = rfd, wfd

    def send(self, obj: dict) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        if len(data) > MAX_MESSAGE:
            raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
        view = memoryview(struct.pack(">I", len(data)) + data)
        while view:
            try:
                n = os.write(self.wfd, view)
            except BrokenPipeError as exc:
                raise PeerGone("the other process closed its pipe") from exc
            view = view[n:]

    def recv(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        head = self._read(4, deadline)
        (n,) = struct.unpack(">I", head)
        if n > MAX_MESSAGE:
            raise ProtocolError(f"message length {n} exceeds {MAX_MESSAGE}")
        try:
            obj = json.loads(self._read(n, deadline))
        except ValueError as exc:
            raise ProtocolError(f"undecodable message: {exc}") from exc
        if not isinstance(obj, dict):
            raise ProtocolError(f"message is {type(obj).__name__}, not an object")
        return obj

    def _read(self, n: int, deadline: float | None) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise PeerTimeout("no answer before the deadline")
            ready, _, _ = select.select([self.rfd], [], [], left)
            if not ready:
                raise PeerTimeout("no answer before the deadline")
            chunk = os.read(self.rfd, n - len(buf))
            if not chunk:
                raise PeerGone("the other process closed its pipe (it exited or crashed)")
            buf += chunk
        return bytes(buf)


class Arena:
    """A file both ends map: the judge writes inputs and weights, the remote writes outputs."""

    def __init__(self, path: str, size: int = 0):
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT if size else 0)
        self.fd = os.open(path, flags, 0o660)
        self.size = 0
        self.mm: mmap.mmap | None = None
        if size:
            os.ftruncate(self.fd, size)
        self.remap()

    def remap(self) -> None:
        size = os.fstat(self.fd).st_size
        if size == self.size and self.mm is not None:
            return
        old = self.mm
        self.mm = mmap.mmap(self.fd, size) if size else None
        self.size = size
        if old is not None:
            try:
                old.close()
            except BufferError:  # a view of the old mapping is still alive: it goes with its last user
                pass

    def ensure(self, size: int) -> None:
        """Judge side: grow the file to at least `size` bytes (the remote remaps when told)."""
        if size > self.size:
            os.ftruncate(self.fd, size)
            self.remap()

    def close(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass
        os.close(self.fd)

    # ------------------------------------------------------------------ tensors
    def raw(self, off: int, nbytes: int) -> torch.Tensor:
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(self.mm, dtype=torch.uint8, count=nbytes, offset=off)

    def put(self, values: list, start: int, end: int | None = None) -> tuple[list[dict], int]:
        """Write tensors (any device) and plain values from `start`; descriptors and the next free offset."""
        return put_values(self.raw, values, start, self.size if end is None else end)

    def get(self, desc, lo: int = 0, hi: int | None = None):
        """A descriptor's value; a tensor is a view into the file (copy it before the region is reused)."""
        if isinstance(desc, dict) and desc.get("t") == "value":
            return desc.get("v")
        off, nbytes, shape, dtype = tensor_desc(desc, lo, self.size if hi is None else hi)
        return self.raw(off, nbytes).view(dtype).reshape(shape)


def tensor_desc(desc, lo: int, hi: int) -> tuple[int, int, list, torch.dtype]:
    """A tensor descriptor from the other end, validated: (offset, bytes, shape, dtype) inside [lo, hi)."""
    if not isinstance(desc, dict):
        raise ProtocolError("descriptor is not an object")
    if desc.get("t") != "tensor":
        raise ProtocolError(f"unknown descriptor kind {desc.get('t')!r}")
    off, nbytes, shape, dtype = desc.get("off"), desc.get("nbytes"), desc.get("shape"), desc.get("dtype")
    if not (isinstance(off, int) and isinstance(nbytes, int) and isinstance(shape, list)):
        raise ProtocolError("tensor descriptor fields have the wrong types")
    if dtype not in DTYPES:
        raise ProtocolError(f"tensor dtype {dtype!r} is not allowed")
    if len(shape) > MAX_DIMS or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise ProtocolError(f"bad tensor shape {shape!r}")
    item = torch.empty(0, dtype=DTYPES[dtype]).element_size()
    if math.prod(shape) * item != nbytes:
        raise ProtocolError(f"shape {shape} of {dtype} is not {nbytes} bytes")
    if off < lo or off % ALIGN or off + nbytes > hi:
        raise ProtocolError(f"tensor at [{off}, {off + nbytes}) lies outside its region [{lo}, {hi})")
    return off, nbytes, shape, DTYPES[dtype]


def place(region_of, values: list, start: int, end: int) -> tuple[list[dict], int]:
    """Tensors written from `start` through `region_of(off, nbytes)` (a uint8 view); descriptors, next offset."""
    descs, pos = [], start
    for v in values:
        t = v.detach().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise ProtocolError(f"tensor dtype {t.dtype} cannot be passed")
        nbytes = t.numel() * t.element_size()
        pos = align(pos)
        if pos + nbytes > end:
            raise ProtocolError(f"tensors need more than the {end - start} bytes of their region")
        if nbytes:
            dst = region_of(pos, nbytes)
            if dst.device.type == "cpu" and t.device.type == "cpu":
                # libc's memcpy, not torch's copy kernel: the worker's CPU profile counts time in torch's code
                # during a run as the model's compute (cpu_profile.py), so the protocol's own copy stays out of it
                ctypes.memmove(dst.data_ptr(), t.data_ptr(), nbytes)
            else:
                dst.copy_(t.reshape(-1).view(torch.uint8))
        descs.append({"t": "tensor", "off": pos, "nbytes": nbytes, "shape": list(t.shape), "dtype": dtype})
        pos += nbytes
    return descs, pos


# ---------------------------------------------------------------------- sealing
# CUDA: inputs reach the remote sealed: every tensor's bits XORed with a pad drawn from a key the judge
# sends only with "run". Nothing can be computed from them before the clock starts. (CPU: no sealing; the
# judge writes the plaintext into the arena only once its clock for the call runs, judge.layout_plain: the
# unsealing, serial on the CPU generator, was protocol work in the candidate's process that a fused kernel
# could do faster than the probe's stand-in did, docs/sandbox.md.) The judge copies
# the outputs out of the arena as the "run" reply arrives, so nothing computed after it counts either.
_BITS = {1: (torch.uint8, 256), 2: (torch.int16, 1 << 15), 4: (torch.int32, 1 << 31), 8: (torch.int64, 1 << 62)}


def _pad_view(t: torch.Tensor, key: int):
    if t.dtype == torch.bool:
        view, high = t.view(torch.uint8), 2
    else:
        view, high = _BITS[t.element_size()]
        view = t.view(view)
    gen = torch.Generator(device=t.device).manual_seed(key)
    return view, torch.randint(0, high, view.shape, dtype=view.dtype, device=t.device, generator=gen)


def seal(values: list, key: int) -> None:
    """XOR every tensor's bits (in place) with the pad of `key` + its index; sealing twice unseals."""
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor) and v.numel() and not v.is_complex():
            view, pad = _pad_view(v, (key + i) % (1 << 62))
            view.bitwise_xor_(pad)


def nbytes_of(values: list) -> int:
    """Bytes `put` needs for these values (alignment included)."""
    return sum(align(v.numel() * v.element_size()) + ALIGN for v in values if isinstance(v, torch.Tensor))


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plain(v):
    """A JSON-able copy of a task's plain value (int, float, str, bool, None, lists/tuples of them)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    raise ProtocolError(f"a value of type {type(v).__name__} cannot be passed to the model")


def put_values(region_of, values: list, start: int, end: int) -> tuple[list[dict], int]:
    """Tensors (any device) and plain values written into the uint8 regions `region_of(offset, nbytes)` gives,
    from `start`; their descriptors and the next free offset (Arena.put; the judge's private input buffer)."""
    descs, pos = [], start
    for v in values:
        if isinstance(v, torch.Tensor):
            d, pos = place(region_of, [v], pos, end)
            descs += d
        else:
            descs.append({"t": "value", "v": plain(v)})
    return descs, pos
