"""Gather the policy's tensors bucket by bucket into reused host buffers (pinned on CUDA), laid out as safetensors.

The hot path of an in-memory weight publish (``learner.weight_layout = "buckets"``): no host copy of the whole
state dict and no second copy to serialise it. Each bucket's tensors are copied from the device straight into
their place after a safetensors header in one of two host slots, so the next bucket's device-to-host copies run
while the caller sends the current one. Under ZeRO-3 every rank gathers one bucket's parameters at a time
(collectively) and rank 0 alone copies them out. The bytes are a safetensors serialisation that
``safetensors.torch.load`` (and cluster.weights.buckets.tensors_of, the actors' side) reads as it is.
"""
from __future__ import annotations

import contextlib
import json
import logging
import struct
from dataclasses import dataclass
from typing import Iterator

log = logging.getLogger(__name__)

_DTYPE_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float64": "F64", "int64": "I64",
                "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # torch's name without the prefix: "bfloat16"
    nbytes: int


def plan(entries: list[Entry], bucket_bytes: int) -> list[list[Entry]]:
    """Group entries, in order, into buckets of about ``bucket_bytes`` of data (one tensor never splits)."""
    groups: list[list[Entry]] = []
    size = 0
    for e in entries:
        if not groups or (groups[-1] and size + e.nbytes > bucket_bytes):
            groups.append([])
            size = 0
        groups[-1].append(e)
        size += e.nbytes
    return groups


def header(group: list[Entry]) -> bytes:
    """The safetensors prefix for ``group`` laid out back to back: 8-byte length, then the JSON padded to 8."""
    meta, off = {}, 0
    for e in group:
        if e.dtype not in _DTYPE_NAMES:
            raise ValueError(f"{e.name}: dtype {e.dtype} has no safetensors name")
        meta[e.name] = {"dtype": _DTYPE_NAMES[e.dtype], "shape": list(e.shape), "data_offsets": [off, off + e.nbytes]}
        off += e.nbytes
    text = json.dumps(meta, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def tied_keys(module) -> set[str]:
    """The state dict's names that a checkpoint leaves out: tied copies (a tied LM head)."""
    return set(getattr(module, "all_tied_weights_keys", None) or getattr(module, "_tied_weights_keys", None) or {})


def _entries(module, zero_stage: int) -> tuple[list[Entry], dict]:
    """What a checkpoint of ``module`` holds (tied copies left out), by name, with the tensors behind them."""
    tied = tied_keys(module)
    out, tensors = [], {}
    for name, t in module.state_dict(keep_vars=True).items():
        if name in tied:
            continue
        shape = tuple(getattr(t, "ds_shape", None) or t.shape) if zero_stage == 3 else tuple(t.shape)
        numel = 1
        for d in shape:
            numel *= int(d)
        out.append(Entry(name, shape, str(t.dtype).removeprefix("torch."), numel * t.element_size()))
        tensors[name] = t
    return out, tensors


class BucketExporter:
    """Two host slots, kept across versions (pinned allocation is slow); ``buckets`` fills and yields them."""

    def __init__(self, bucket_bytes: int, pinned: bool | None = None) -> None:
        self.bucket_bytes = int(bucket_bytes)
        self.pinned = pinned
        self._slots: list = []
        self._slot_bytes = 0
        self.stats: dict = {}

    def _ensure_slots(self, nbytes: int, on_cuda: bool) -> None:
        import torch

        pin = on_cuda if self.pinned is None else self.pinned
        if self._slots and self._slot_bytes >= nbytes:
            return
        self._slots = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin) for _ in range(2)]
        self._slot_bytes = nbytes
        log.info("weight export: two %s host slots of %.1f MB", "pinned" if pin else "pageable", nbytes / 1e6)

    def buckets(self, module, zero_stage: int = 0, rank: int = 0) -> Iterator[memoryview]:
        """Yield each bucket's safetensors bytes (rank 0; other ranks only take part in ZeRO-3's gathers). A view
        stays valid until the next one is asked for."""
        import torch

        entries, tensors = _entries(module, zero_stage)
        groups = plan(entries, self.bucket_bytes)
        heads = [header(g) for g in groups]
        sizes = [len(h) + sum(e.nbytes for e in g) for h, g in zip(heads, groups)]
        on_cuda = any(t.is_cuda for t in tensors.values())
        if rank == 0:
            self._ensure_slots(max(sizes), on_cuda)
        self.stats = {"buckets": len(groups), "bytes": sum(sizes)}
        stream = torch.cuda.Stream() if on_cuda and rank == 0 else None
        pending = None  # (view, event) of the bucket copied but not yet handed out
        for i, (group, head) in enumerate(zip(groups, heads)):
            params = [tensors[e.name] for e in group]
            if zero_stage == 3:
                import deepspeed

                with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                    cur = self._fill(i % 2, group, head, params, stream) if rank == 0 else None
                    if cur is not None and cur[1] is not None:
                        cur[1].synchronize()  # the gathered copies are freed when this block ends
            else:
                cur = self._fill(i % 2, group, head, params, stream) if rank == 0 else None
            if pending is not None:
                yield _ready(pending)
            pending = cur
        if pending is not None:
            yield _ready(pending)

    def _fill(self, slot: int, group: list[Entry], head: bytes, params: list, stream):
        """Write the header and enqueue every tensor's copy into ``slot``; (view of the bucket, event or None)."""
        import torch

        buf = self._slots[slot]
        n = len(head) + sum(e.nbytes for e in group)
        buf[:len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
        off = len(head)
        event = None
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())  # the parameters as the last optimizer step left them
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for e, p in zip(group, params):
                src = p.detach().contiguous().reshape(-1).view(torch.uint8)
                buf[off:off + e.nbytes].copy_(src, non_blocking=stream is not None)
                off += e.nbytes
            if stream is not None:
                event = torch.cuda.Event()
                event.record(stream)
        return memoryview(buf[:n].numpy()), event


def _ready(pending) -> memoryview:
    view, event = pending
    if event is not None:
        event.synchronize()
    return view

