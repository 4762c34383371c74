"""The "buckets" layout: a policy version as an ordered list of in-memory buckets, sent over Kafka, verified.

A bucket is the safetensors serialisation of some of the policy's tensors (``pack``: about
``bucket_bytes`` each; a tensor larger than that is a bucket of its own). The learner sends bucket i as
WeightChunks named ``bucket-<i>`` on one partition of topics.WEIGHTS_CHUNKS (the ``files`` layout's
Kafka scheme and URI: located by record time and key, so it survives mirroring), then announces layout
"buckets" with every bucket's hash and size (cluster.weights.digest: blake3 now, sha256 in older versions; the
announcement's ``digest`` says which). An actor
(``receive_buckets``) assembles one bucket at a time in memory, checks it against the announcement and
hands it on (``receive_pipelined``: while the next one arrives); nothing touches a disk on either side.
``tensors_of`` turns a verified bucket back into (name, tensor) pairs for the engine's ``load_weights``.

With learner.weight_compression = "xor-delta" a version also carries a delta section (cluster.weights.codec:
why every version keeps its full buckets too): after the full chunks, each bucket encoded against the same
bucket of the previous published version, keyed apart. A receiver passing ``HeldBuckets`` (its copy of the last
version it received) reads the deltas when it holds their base, the full buckets otherwise.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass
from pathlib import Path

from cluster.weights import codec, digest
from cluster.weights import transport as wt
from cluster.weights.fs import WeightsCorrupt, announced_digest, manifest_digest
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
def delta_name(i: int) -> str:
    return f"delta-{i:05d}"


def delta_key(model_name: str, version: int) -> str:
    return f"{model_name}:{version}:delta"


def _send(producer, model_name: str, version: int, key: str, name: str, data: bytes, chunk_bytes: int,
          index: int, futures: list, alg: str) -> int:
    """Send ``data`` as WeightChunks named ``name`` from chunk ``index`` on; returns the next index. A blake3
    version's chunks carry no hash of their own: the receiver hands on only a bucket that matches its announced
    hash, and Kafka's record CRC32C covers each chunk on the wire, so a second hash of every byte on both sides
    bought only an earlier error message. A sha256 version (the older format) keeps its per-chunk sha256, which
    older readers check."""
    view = memoryview(data)
    for off in range(0, len(data), chunk_bytes):
        part = bytes(view[off:off + chunk_bytes])
        futures.append(producer.send(topics.WEIGHTS_CHUNKS, WeightChunk(
            model_name=model_name, version=version, index=index, count=0, file_name=name,
            offset=off, data=part, sha256=digest.hexdigest(alg, part) if alg == digest.SHA256 else ""), key=key))
        index += 1
    return index


def publish_kafka_buckets(producer, model_name: str, version: int, buckets: Iterable[bytes], chunk_bytes: int,
                          step: int = 0, timeout_s: float = 120.0, delta=None,
                          alg: str = digest.DEFAULT) -> WeightAnnouncement:
    """Send each bucket as WeightChunks (one bucket in memory at a time); return the announcement to send (every
    hash of it ``alg``'s).

    With ``delta`` (a cluster.weights.codec.DeltaEncoder, which keeps this version's buckets as the next one's
    base), each bucket is also encoded against the same bucket of the version it last saw published; these
    entries are sent after every full chunk, under their own key (so a full receiver never meets one inside
    its range), as the announcement's delta section."""
    key = f"{model_name}:{version}"
    shas, sizes, futures, index, entries = [], [], [], 0, []
    if delta is not None:
        delta.begin()
    for i, data in enumerate(buckets):
        shas.append(digest.hexdigest(alg, data))
        sizes.append(len(data))
        index = _send(producer, model_name, version, key, bucket_name(i), data, chunk_bytes, index, futures, alg)
        if delta is not None:  # encoded while the producer's thread sends the full chunks
            entries.append(delta.entry(i, data))
    if not shas:
        raise WeightsCorrupt(f"weights v{version}: no tensors to publish")
    full = len(futures)
    if any(base >= 0 for base, _ in entries):  # else (the first version) there is no section to read
        d = 0
        for i, (_, enc) in enumerate(entries):
            d = _send(producer, model_name, version, delta_key(model_name, version), delta_name(i), enc,
                      chunk_bytes, d, futures, alg)
    producer.flush(timeout_s)
    metas = [f.get(timeout=timeout_s) for f in futures]  # raises BusError: then nothing is announced
    uri = wt.chunks_uri(metas[0].partition, metas[0].timestamp)
    ann = WeightAnnouncement(model_name=model_name, version=version, transport="kafka", uri=uri,
                             num_chunks=index, total_bytes=sum(sizes), sha256=bucket_digest(shas, alg), step=step,
                             layout="buckets", buckets=shas, bucket_bytes=sizes, digest=alg)
    if delta is not None:
        delta.commit(version, len(shas))
        _describe_deltas(ann, delta.codec, entries, metas[full:])
    return ann


def _describe_deltas(ann: WeightAnnouncement, codec_name: str, entries: list, metas: list) -> None:
    """Fill in the announcement's delta section from the entries sent and their chunks' record metadata."""
    ann.delta_codec = codec_name
    if not metas:
        return
    ann.delta_uri = wt.chunks_uri(metas[0].partition, metas[0].timestamp)
    ann.delta_chunks = len(metas)
    ann.delta_base = [b for b, _ in entries]
    ann.delta_bytes = [len(enc) for _, enc in entries]
    log.info("weights v%d: %d bytes, delta section %d bytes (%.2fx)", ann.version, ann.total_bytes,
             sum(ann.delta_bytes), wire_ratio(ann))


def wire_ratio(ann: WeightAnnouncement) -> float:
    """Raw bytes over the bytes a receiver holding the base reads (1.0 without a delta section)."""
    return ann.total_bytes / sum(ann.delta_bytes) if ann.delta_bytes else 1.0


def bucket_digest(hashes: list[str], alg: str) -> str:
    """The version digest of a bucket list: ``alg`` over its "bucket-<i> <hash>" lines."""
    return manifest_digest({bucket_name(i): h for i, h in enumerate(hashes)}, alg)


# ---- receiving ----------------------------------------------------------------------------
class HeldBuckets:
    """A receiver's copy of the buckets of the last version it received (the base of the next version's
    deltas): replaced bucket by bucket as a version arrives, so one version's bytes are held, not two; until
    that version is complete, ``version`` is None and the next one is read in full."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.buckets: list[bytes] = []

    def can_decode(self, ann: WeightAnnouncement) -> bool:
        """Whether every delta entry of ``ann`` is against the version held (entries of -1 go whole)."""
        if not ann.delta_chunks or self.version is None or ann.delta_codec not in (codec.CODEC, codec.PLAIN):
            return False
        return all(b == -1 or (b == self.version and i < len(self.buckets)) for i, b in enumerate(ann.delta_base))

    def put(self, i: int, data: bytes) -> None:
        self.version = None
        if i < len(self.buckets):
            self.buckets[i] = data
        else:
            self.buckets.append(data)

    def commit(self, version: int, count: int) -> None:
        del self.buckets[count:]
        self.version = version


@dataclass
class _Section:
    """One run of chunks to assemble: the full buckets, or the delta entries."""

    key: str
    names: list[str]
    sizes: list[int]
    chunks: int
    delta: bool


def _full(ann: WeightAnnouncement) -> _Section:
    return _Section(f"{ann.model_name}:{ann.version}", [bucket_name(i) for i in range(len(ann.buckets))],
                    ann.bucket_bytes, ann.num_chunks, False)


def _deltas(ann: WeightAnnouncement) -> _Section:
    return _Section(delta_key(ann.model_name, ann.version), [delta_name(i) for i in range(len(ann.buckets))],
                    ann.delta_bytes, ann.delta_chunks, True)


def check_announcement(ann: WeightAnnouncement) -> None:
    """A buckets announcement must be self-consistent before any byte is fetched."""
    if ann.layout != "buckets" or ann.transport != "kafka":
        raise WeightsCorrupt(f"weights v{ann.version}: layout {ann.layout!r} over {ann.transport!r} is not an "
                             "in-memory (kafka buckets) version")
    if (not ann.buckets or len(ann.buckets) != len(ann.bucket_bytes) or sum(ann.bucket_bytes) != ann.total_bytes
            or bucket_digest(ann.buckets, announced_digest(ann)) != ann.sha256):
        raise WeightsCorrupt(f"weights v{ann.version}: bucket list does not match the announced digest/size")
    if (ann.delta_chunks or ann.delta_base or ann.delta_bytes) and (
            ann.delta_chunks <= 0 or len(ann.delta_base) != len(ann.buckets)
            or len(ann.delta_bytes) != len(ann.buckets) or min(ann.delta_bytes) <= 0
            or not wt._URI.match(ann.delta_uri)):
        raise WeightsCorrupt(f"weights v{ann.version}: its delta section does not match its bucket list")


def receive_buckets(bus, ann: WeightAnnouncement, on_bucket: Callable[[int, bytes], None],
                    timeout_s: float = 120.0, cancelled=None, held: HeldBuckets | None = None) -> int:
    """Fetch every bucket into memory, verify it, and hand it to ``on_bucket(i, data)`` in order.

    With ``held`` (the receiver's copy of the last version it received, updated here): the delta section is
    read and decoded against it when it holds the base version, the full buckets otherwise; either way each
    bucket handed on matches its announced hash (of ``ann.digest``'s algorithm). Raises WeightsCorrupt /
    WeightsMissing / WeightsTimeout / WeightsCancelled; buckets already handed on are then the caller's to drop.
    Returns the number of buckets."""
    check_announcement(ann)
    sec = _deltas(ann) if held is not None and held.can_decode(ann) else _full(ann)
    wait_s = min(timeout_s, wt.ARRIVAL_WAIT_S)
    cons = _open_deltas(bus, ann, wait_s) if sec.delta else wt.open_chunks(bus, ann, wait_s)
    log.debug("weights v%d: reading its %s", ann.version, "delta section" if sec.delta else "full buckets")

    def finish(i: int, data: bytes) -> None:
        if sec.delta and ann.delta_base[i] >= 0:
            data = codec.decode(data, held.buckets[i], ann.delta_codec)
        if digest.hexdigest(ann.digest, data) != ann.buckets[i]:
            raise WeightsCorrupt(f"weights v{ann.version}: bucket {i} fails its announced {ann.digest}"
                                 + (" (decoded from its delta)" if sec.delta else ""))
        log.debug("weights v%d: bucket %d/%d verified", ann.version, i + 1, len(ann.buckets))
        if held is not None:
            held.put(i, data)
        on_bucket(i, data)

    try:
        _assemble(cons, ann, sec, finish, time.monotonic() + timeout_s, cancelled or (lambda: False))
    finally:
        cons.close()
    if held is not None:
        held.commit(ann.version, len(ann.buckets))
    return len(ann.buckets)


def _open_deltas(bus, ann: WeightAnnouncement, wait_s: float):
    """A consumer (the caller closes it) at the version's delta chunk 0, found as ``open_chunks`` finds chunk 0:
    by record time, key and index, once all its delta chunks can be in the log."""
    from kafka import TopicPartition

    m = wt._URI.match(ann.delta_uri)
    if not m or m["t"] is None:
        raise WeightsCorrupt(f"weights v{ann.version}: bad delta uri {ann.delta_uri!r}")
    topic, part = m["topic"], int(m["partition"])
    cons = bus.consumer([topic], None, assign=[(topic, part)], expected=WeightChunk, dlq=False)
    try:
        tp = TopicPartition(bus.topic(topic), part)
        deadline, start = time.monotonic() + wait_s, None
        while True:
            if start is None:
                start = wt._first_chunk(cons, tp, delta_key(ann.model_name, ann.version), int(m["t"]))
            end = cons.kafka.end_offsets([tp])[tp]
            if start is not None and end - start >= ann.delta_chunks:
                break
            if time.monotonic() >= deadline:
                raise wt.ChunksNotArrived(f"weights v{ann.version}: its {ann.delta_chunks} delta chunks are not in "
                                          f"{tp.topic}[{tp.partition}] after {wait_s:.0f}s")
            time.sleep(0.3)
        cons.kafka.seek(tp, start)
        return cons
    except BaseException:
        cons.close()
        raise


def receive_pipelined(bus, ann: WeightAnnouncement, submit: Callable[[int, bytes], Future],
                      timeout_s: float = 120.0, cancelled=None, held: HeldBuckets | None = None) -> int:
    """``receive_buckets``, where ``submit(i, data)`` starts handing bucket i over (to the engine) and returns
    its Future: bucket i is handed over while bucket i + 1 arrives, one at a time. When this returns, every
    bucket was handed over; when it raises, none is still being handed over."""
    last: list[Future | None] = [None]

    def on_bucket(i: int, data: bytes) -> None:
        if last[0] is not None:
            last[0].result(timeout_s)
        last[0] = submit(i, data)

    try:
        n = receive_buckets(bus, ann, on_bucket, timeout_s, cancelled, held)
    except BaseException:
        if last[0] is not None:
            wait([last[0]], timeout_s)
        raise
    if last[0] is not None:
        last[0].result(timeout_s)
    return n


def _assemble(cons, ann: WeightAnnouncement, sec: _Section, finish, deadline: float, cancelled) -> None:
    """Chunks 0..n-1 of the section arrive in order (one partition); each completed entry goes to ``finish``."""
    nxt, entry, buf = 0, 0, bytearray()
    while nxt < sec.chunks:
        if time.monotonic() > deadline:
            raise wt.WeightsTimeout(f"weights v{ann.version}: {nxt}/{sec.chunks} chunks in time")
        if cancelled():
            raise wt.WeightsCancelled(f"weights v{ann.version}: stopped at chunk {nxt}/{sec.chunks}")
        for rec in cons.poll(timeout_s=0.5):
            c = rec.msg
            if rec.key != sec.key or c.model_name != ann.model_name or c.version != ann.version or c.index < nxt:
                continue  # another version's (or section's) chunks on the same partition, or a redelivered one
            _check_chunk(c, ann, sec, nxt, entry, len(buf))
            buf += c.data
            nxt += 1
            if len(buf) == sec.sizes[entry]:
                finish(entry, bytes(buf))
                entry, buf = entry + 1, bytearray()
            if nxt == sec.chunks:
                break
    if entry != len(ann.buckets):
        raise WeightsCorrupt(f"weights v{ann.version}: {entry} of {len(ann.buckets)} buckets in "
                             f"{sec.chunks} chunks")


def _check_chunk(c: WeightChunk, ann: WeightAnnouncement, sec: _Section, nxt: int, entry: int, have: int) -> None:
    if c.index != nxt:
        raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} where {nxt} was due")
    if entry >= len(sec.names) or c.file_name != sec.names[entry] or c.offset != have:
        raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} is {c.file_name}@{c.offset}, expected "
                             f"{sec.names[min(entry, len(sec.names) - 1)]}@{have}")
    if have + len(c.data) > sec.sizes[entry]:
        raise WeightsCorrupt(f"weights v{ann.version}: {sec.names[entry]} is longer than announced")
    if c.sha256 and digest.hexdigest(ann.digest, c.data) != c.sha256:  # "": none sent (_send); the bucket's checks
        raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} fails its {ann.digest}")
