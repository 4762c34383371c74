"""The "buckets" layout: a policy version as an ordered list of in-memory buckets, sent over Kafka, verified.

A bucket is the safetensors serialisation of some of the policy's tensors (``pack``: about
``bucket_bytes`` each; a tensor larger than that is a bucket of its own). The learner sends bucket i as
WeightChunks named ``bucket-<i>`` on one partition of topics.WEIGHTS_CHUNKS (the ``files`` layout's
Kafka scheme and URI: located by record time and key, so it survives mirroring), then announces layout
"buckets" with every bucket's sha256 and size. An actor
(``receive_buckets``) assembles one bucket at a time in memory, checks it against the announcement and
hands it on (``receive_pipelined``: while the next one arrives); nothing touches a disk on either side.
``tensors_of`` turns a verified bucket back into (name, tensor) pairs for the engine's ``load_weights``.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, wait
from pathlib import Path

from cluster.weights import transport as wt
from cluster.weights.fs import WeightsCorrupt, manifest_digest
from schemas import topics
from schemas.messages import WeightAnnouncement, WeightChunk

log = logging.getLogger(__name__)


def bucket_name(i: int) -> str:
    return f"bucket-{i:05d}"


def pack(tensors: Iterable[tuple[str, object]], bucket_bytes: int) -> Iterator[bytes]:
    """Group (name, tensor) pairs into safetensors buckets of about ``bucket_bytes`` (one tensor never splits)."""
    from safetensors.torch import save

    group: dict = {}
    size = 0
    for name, t in tensors:
        n = t.numel() * t.element_size()
        if group and size + n > bucket_bytes:
            yield save(group)
            group, size = {}, 0
        group[name] = t.detach().contiguous()
        size += n
    if group:
        yield save(group)


def folder_tensors(folder: str | Path) -> Iterator[tuple[str, object]]:
    """The (name, tensor) pairs of a Hugging Face folder's *.safetensors files, one tensor at a time."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise WeightsCorrupt(f"{folder}: no *.safetensors file")
    for p in files:
        with safe_open(str(p), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def tensors_of(data: bytes) -> list[tuple[str, object]]:
    """A verified bucket's (name, tensor) pairs; a malformed one is a WeightsCorrupt."""
    from safetensors.torch import load

    try:
        return list(load(bytes(data)).items())
    except Exception as exc:  # safetensors raises its own error types
        raise WeightsCorrupt(f"a weight bucket is not a safetensors serialisation: {exc}") from exc


# ---- publishing ---------------------------------------------------------------------------
def publish_kafka_buckets(producer, model_name: str, version: int, buckets: Iterable[bytes], chunk_bytes: int,
                          step: int = 0, timeout_s: float = 120.0) -> WeightAnnouncement:
    """Send each bucket as WeightChunks (one bucket in memory at a time); return the announcement to send."""
    key = f"{model_name}:{version}"
    shas, sizes, futures, index = [], [], [], 0
    for i, data in enumerate(buckets):
        shas.append(hashlib.sha256(data).hexdigest())
        sizes.append(len(data))
        view = memoryview(data)
        for off in range(0, len(data), chunk_bytes):
            part = bytes(view[off:off + chunk_bytes])
            futures.append(producer.send(topics.WEIGHTS_CHUNKS, WeightChunk(
                model_name=model_name, version=version, index=index, count=0, file_name=bucket_name(i),
                offset=off, data=part, sha256=hashlib.sha256(part).hexdigest()), key=key))
            index += 1
    if not shas:
        raise WeightsCorrupt(f"weights v{version}: no tensors to publish")
    producer.flush(timeout_s)
    metas = [f.get(timeout=timeout_s) for f in futures]  # raises BusError: then nothing is announced
    uri = wt.chunks_uri(metas[0].partition, metas[0].timestamp)
    return WeightAnnouncement(model_name=model_name, version=version, transport="kafka", uri=uri,
                              num_chunks=index, total_bytes=sum(sizes), sha256=bucket_digest(shas), step=step,
                              layout="buckets", buckets=shas, bucket_bytes=sizes)


def bucket_digest(shas: list[str]) -> str:
    return manifest_digest({bucket_name(i): h for i, h in enumerate(shas)})


# ---- receiving ----------------------------------------------------------------------------
def check_announcement(ann: WeightAnnouncement) -> None:
    """A buckets announcement must be self-consistent before any byte is fetched."""
    if ann.layout != "buckets" or ann.transport != "kafka":
        raise WeightsCorrupt(f"weights v{ann.version}: layout {ann.layout!r} over {ann.transport!r} is not an "
                             "in-memory (kafka buckets) version")
    if (not ann.buckets or len(ann.buckets) != len(ann.bucket_bytes) or sum(ann.bucket_bytes) != ann.total_bytes
            or bucket_digest(ann.buckets) != ann.sha256):
        raise WeightsCorrupt(f"weights v{ann.version}: bucket list does not match the announced digest/size")


def receive_buckets(bus, ann: WeightAnnouncement, on_bucket: Callable[[int, bytes], None],
                    timeout_s: float = 120.0, cancelled=None) -> int:
    """Fetch every bucket into memory, verify it, and hand it to ``on_bucket(i, data)`` in order.

    Raises WeightsCorrupt / WeightsMissing / WeightsTimeout / WeightsCancelled; buckets already handed on
    are then the caller's to drop. Returns the number of buckets."""
    check_announcement(ann)
    cons = wt.open_chunks(bus, ann, min(timeout_s, wt.ARRIVAL_WAIT_S))
    try:
        _assemble(cons, ann, on_bucket, time.monotonic() + timeout_s, cancelled or (lambda: False))
    finally:
        cons.close()
    return len(ann.buckets)


def receive_pipelined(bus, ann: WeightAnnouncement, submit: Callable[[int, bytes], Future],
                      timeout_s: float = 120.0, cancelled=None) -> int:
    """``receive_buckets``, where ``submit(i, data)`` starts handing bucket i over (to the engine) and returns
    its Future: bucket i is handed over while bucket i + 1 arrives, one at a time. When this returns, every
    bucket was handed over; when it raises, none is still being handed over."""
    last: list[Future | None] = [None]

    def on_bucket(i: int, data: bytes) -> None:
        if last[0] is not None:
            last[0].result(timeout_s)
        last[0] = submit(i, data)

    try:
        n = receive_buckets(bus, ann, on_bucket, timeout_s, cancelled)
    except BaseException:
        if last[0] is not None:
            wait([last[0]], timeout_s)
        raise
    if last[0] is not None:
        last[0].result(timeout_s)
    return n


def _assemble(cons, ann: WeightAnnouncement, on_bucket, deadline: float, cancelled) -> None:
    """Chunks 0..n-1 arrive in order (one partition); each completed bucket is checked, then handed on."""
    nxt, bucket, buf = 0, 0, bytearray()
    while nxt < ann.num_chunks:
        if time.monotonic() > deadline:
            raise wt.WeightsTimeout(f"weights v{ann.version}: {nxt}/{ann.num_chunks} chunks in time")
        if cancelled():
            raise wt.WeightsCancelled(f"weights v{ann.version}: stopped at chunk {nxt}/{ann.num_chunks}")
        for rec in cons.poll(timeout_s=0.5):
            c = rec.msg
            if c.model_name != ann.model_name or c.version != ann.version or c.index < nxt:
                continue  # another version's chunks on the same partition, or a redelivered one
            _check_chunk(c, ann, nxt, bucket, len(buf))
            buf += c.data
            nxt += 1
            if len(buf) == ann.bucket_bytes[bucket]:
                if hashlib.sha256(buf).hexdigest() != ann.buckets[bucket]:
                    raise WeightsCorrupt(f"weights v{ann.version}: bucket {bucket} fails its announced sha256")
                log.debug("weights v%d: bucket %d/%d verified", ann.version, bucket + 1, len(ann.buckets))
                on_bucket(bucket, bytes(buf))
                bucket, buf = bucket + 1, bytearray()
            if nxt == ann.num_chunks:
                break
    if bucket != len(ann.buckets):
        raise WeightsCorrupt(f"weights v{ann.version}: {bucket} of {len(ann.buckets)} buckets in "
                             f"{ann.num_chunks} chunks")


def _check_chunk(c: WeightChunk, ann: WeightAnnouncement, nxt: int, bucket: int, have: int) -> None:
    if c.index != nxt:
        raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} where {nxt} was due")
    if bucket >= len(ann.buckets) or c.file_name != bucket_name(bucket) or c.offset != have:
        raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} is {c.file_name}@{c.offset}, expected "
                             f"{bucket_name(bucket)}@{have}")
    if have + len(c.data) > ann.bucket_bytes[bucket]:
        raise WeightsCorrupt(f"weights v{ann.version}: bucket {bucket} is longer than announced")
    if hashlib.sha256(c.data).hexdigest() != c.sha256:
        raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} fails its sha256")
