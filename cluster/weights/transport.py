"""Moving a policy version (a Hugging Face folder) from the learner to the actors, verified.

Neutral ground for both sides: the learner publishes with ``publish_kafka`` /
``publish_fs`` (or cluster.weights.stream for ``nccl``) and then ``announce``s; an actor calls ``receive`` on a
``WeightAnnouncement`` and gets a local folder whose every byte was checked
(per-chunk hash, per-file hash, and the version digest: a hash over the "<name> <file hash>" lines in name
order; all of the announcement's ``digest`` algorithm, cluster.weights.digest: blake3 for what is published now,
sha256 for older versions), or an error. A version is announced only after all its bytes are
durable, and a receiver writes into a temporary folder renamed at the end, so a
half-sent or corrupt version is never applied. ``VersionGate`` keeps versions
monotonic on the receiving side. The on-disk layout (folders, manifest, digests, ``publish_fs``) lives in
cluster.weights.fs, shared with cluster.weights.stream; in-memory versions (layout "buckets") in
cluster.weights.buckets.

Kafka layout: every chunk of one version goes to one partition of
topics.WEIGHTS_CHUNKS (key = "<model>:<version>"), in file-name then byte
order; the announcement's ``uri`` is ``kafka://<topic>/<partition>?t=<record time of chunk 0, unix ms>``.
It names no offset, so it survives MirrorMaker 2 (which keeps topic names under the identity policy,
partitions and record timestamps, but not offsets): a receiver asks the broker's time index
(``offsets_for_times``) for the first record at or after that time, finds chunk 0 there by key and index,
and writes the chunks as they arrive, each checked by its hash (memory stays at one chunk, whatever the model
size). Chunks not (yet) all in the log, as on a mirror that is still copying, wait ``ARRIVAL_WAIT_S``, then
fail as ``ChunksNotArrived`` (retriable). The older ``kafka://<topic>/<partition>@<offset>`` form still reads
(one cluster only).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from cluster.errors import KernelRLError, RetriableError
from cluster.weights import digest
from cluster.weights.fs import (EXPORT_PREFIX, MANIFEST, WeightsCorrupt, WeightsMissing, existing_fs, folder_digest,  # noqa: F401
                                manifest_digest, publish_fs, verify_folder, version_dir, version_files,
                                wait_durable)
from cluster.weights.fs import _write_manifest, announced_digest, prune_versions
from cluster.weights.stream import receive_stream
from schemas import topics
from schemas.messages import WeightAnnouncement, WeightChunk

log = logging.getLogger(__name__)

_URI = re.compile(r"^kafka://(?P<topic>[^/?@]+)/(?P<partition>\d+)(?:@(?P<offset>\d+)|\?t=(?P<t>\d+))$")
ARRIVAL_WAIT_S = 5.0  # how long a receiver waits for announced chunks still on their way (a mirror's lag)


class WeightsTimeout(RetriableError):
    """Not all chunks of a version arrived in time."""


class WeightsCancelled(RetriableError):
    """The receiver was asked to stop (its role shuts down) before the version was complete."""


class ChunksNotArrived(WeightsMissing):
    """The announced chunks are not (all) in this cluster's log: a half-sent version, or, on a mirrored
    cluster, chunks still being copied. Not applied now; a retry can help."""

    retriable = True


def chunks_uri(partition: int, timestamp_ms: int | None) -> str:
    """Where a version's chunks are, by partition and record time (no offset: it survives mirroring)."""
    return f"kafka://{topics.WEIGHTS_CHUNKS}/{partition}?t={max(0, int(timestamp_ms or 0))}"


# ---- publishing ---------------------------------------------------------------------------
def publish_kafka(producer, model_name: str, version: int, folder: str | os.PathLike, chunk_bytes: int,
                  step: int = 0, timeout_s: float = 120.0, alg: str = digest.DEFAULT) -> WeightAnnouncement:
    """Send every file of ``folder`` as WeightChunks; return the (not yet sent) announcement (hashes: ``alg``)."""
    folder = Path(folder)
    files = version_files(folder)
    count = sum(max(1, -(-p.stat().st_size // chunk_bytes)) for p in files)
    key = f"{model_name}:{version}"
    per_file, total, index, futures = {}, 0, 0, []
    for p in files:
        fh = digest.hasher(alg)
        with open(p, "rb") as f:
            offset = 0
            while True:
                data = f.read(chunk_bytes)
                if not data and offset > 0:
                    break
                fh.update(data)
                futures.append(producer.send(topics.WEIGHTS_CHUNKS, WeightChunk(
                    model_name=model_name, version=version, index=index, count=count, file_name=p.name,
                    offset=offset, data=data, sha256=digest.hexdigest(alg, data)), key=key))
                index += 1
                offset += len(data)
                total += len(data)
                if len(data) < chunk_bytes:
                    break
        per_file[p.name] = fh.hexdigest()
    if index != count:
        raise KernelRLError(f"weights v{version}: {index} chunks sent, {count} planned (files changed?)")
    producer.flush(timeout_s)
    metas = [f.get(timeout=timeout_s) for f in futures]  # raises BusError: then nothing is announced
    uri = chunks_uri(metas[0].partition, metas[0].timestamp)
    return WeightAnnouncement(model_name=model_name, version=version, transport="kafka", uri=uri,
                              num_chunks=count, total_bytes=total, sha256=manifest_digest(per_file, alg),
                              files=per_file, step=step, digest=alg)


def announce(producer, ann: WeightAnnouncement, timeout_s: float = 60.0) -> None:
    """Publish the announcement (after every byte is durable) and wait for its ack."""
    producer.send(topics.WEIGHTS, ann, key=ann.model_name).get(timeout=timeout_s)


# ---- receiving ----------------------------------------------------------------------------
def receive(bus, ann: WeightAnnouncement, dest_root: str | os.PathLike, timeout_s: float = 120.0,
            cancelled=None, keep: int = 0) -> Path:
    """Materialise and verify the announced version locally; returns the folder to load.

    ``cancelled()`` (optional) is asked between polls: a role that stops does not wait out the timeout.
    ``keep`` > 0: once a version is materialised, only the newest ``keep`` received versions of the model stay
    on disk (a run's versions would otherwise pile up: 538 MB each for SmolLM2)."""
    if ann.transport == "fs":
        if not Path(ann.uri).is_dir():
            raise WeightsMissing(f"weights v{ann.version}: {ann.uri} is not a folder")
        verify_folder(ann.uri, ann)
        return Path(ann.uri)
    if ann.transport == "kafka":
        got = _receive_kafka(bus, ann, dest_root, timeout_s, cancelled or (lambda: False))
    elif ann.transport == "nccl":
        got = _materialise(ann, dest_root, lambda tmp: receive_stream(ann, tmp, timeout_s))
    else:
        raise WeightsCorrupt(f"weights v{ann.version}: unknown transport {ann.transport!r}")
    if keep > 0:
        # Older than the newest ``keep``: an actor that far behind skips to the newest version anyway.
        gone = prune_versions(dest_root, ann.model_name, keep)
        if gone:
            log.info("dropped %d received version(s) older than the newest %d: %s", len(gone), keep,
                     ", ".join(p.name for p in gone))
    return got


def _receive_kafka(bus, ann: WeightAnnouncement, dest_root, timeout_s: float, cancelled) -> Path:
    def fill(tmp: Path) -> dict[str, str]:
        cons = open_chunks(bus, ann, min(timeout_s, ARRIVAL_WAIT_S))
        try:
            return _stream_chunks(cons, ann, tmp, timeout_s, cancelled)
        finally:
            cons.close()

    return _materialise(ann, dest_root, fill)


def open_chunks(bus, ann: WeightAnnouncement, wait_s: float = ARRIVAL_WAIT_S):
    """A consumer (the caller closes it) positioned at the announced version's chunk 0."""
    from kafka import TopicPartition

    m = _URI.match(ann.uri)
    if not m:
        raise WeightsCorrupt(f"weights v{ann.version}: bad kafka uri {ann.uri!r}")
    topic, part = m["topic"], int(m["partition"])
    cons = bus.consumer([topic], None, assign=[(topic, part)], expected=WeightChunk, dlq=False)
    try:
        tp = TopicPartition(bus.topic(topic), part)
        if m["offset"] is not None:  # the older form: one cluster's offsets
            start = int(m["offset"])
            _check_chunks_exist(cons.kafka, tp, start, ann)
        else:
            start = _locate(cons, tp, ann, int(m["t"]), wait_s)
        cons.kafka.seek(tp, start)
        return cons
    except BaseException:
        cons.close()
        raise


def _locate(cons, tp, ann: WeightAnnouncement, t_ms: int, wait_s: float) -> int:
    """The offset of the version's chunk 0 at or after record time ``t_ms``, once all its chunks can be in
    the log (at least ``num_chunks`` records from there); waits up to ``wait_s`` for chunks on their way."""
    deadline = time.monotonic() + wait_s
    start = None
    while True:
        if start is None:
            start = _first_chunk(cons, tp, f"{ann.model_name}:{ann.version}", t_ms)
        end = cons.kafka.end_offsets([tp])[tp]
        if start is not None and end - start >= ann.num_chunks:
            return start
        if time.monotonic() >= deadline:
            where = "no chunk 0" if start is None else f"chunk 0 at offset {start}, log end {end}"
            raise ChunksNotArrived(f"weights v{ann.version}: its {ann.num_chunks} chunks are not in {tp.topic}"
                                   f"[{tp.partition}] at or after t={t_ms} ({where}) after {wait_s:.0f}s")
        time.sleep(0.3)


def _first_chunk(cons, tp, key: str, t_ms: int) -> int | None:
    """Scan from the first record at or after ``t_ms`` to the log's end for chunk 0 keyed ``key``."""
    kc = cons.kafka
    found = kc.offsets_for_times({tp: t_ms}).get(tp)
    if found is None:
        return None
    end = kc.end_offsets([tp])[tp]
    kc.seek(tp, found.offset)
    while kc.position(tp) < end:
        for rec in cons.poll(timeout_s=0.5):
            if rec.key == key and rec.msg.index == 0:
                return rec.offset
    return None


def _materialise(ann: WeightAnnouncement, dest_root, fill) -> Path:
    """Have ``fill(tmp)`` write the version into a temp folder, check it, rename it into place."""
    dest = version_dir(dest_root, ann.model_name, ann.version)
    if dest.exists():
        verify_folder(dest, ann)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{ann.version:08d}.", dir=dest.parent))
    try:
        per_file = fill(tmp)
        if per_file != ann.files or manifest_digest(per_file, announced_digest(ann)) != ann.sha256:
            bad = sorted(n for n in set(per_file) | set(ann.files) if per_file.get(n) != ann.files.get(n))
            raise WeightsCorrupt(f"weights v{ann.version}: files do not match the announcement ({bad or 'digest'})")
        _write_manifest(tmp, ann)
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _check_chunks_exist(kc, tp, start: int, ann: WeightAnnouncement) -> None:
    """Chunks are acknowledged before their announcement is sent, so [start, start + n) is already in the
    log: an offset outside it points at nothing (a forged or mistyped URI, or retention removed it)."""
    first, end = kc.beginning_offsets([tp])[tp], kc.end_offsets([tp])[tp]
    if start < first or start + ann.num_chunks > end:
        raise WeightsMissing(f"weights v{ann.version}: chunks {start}..{start + ann.num_chunks - 1} are not in "
                             f"{tp.topic}[{tp.partition}] (it holds offsets {first}..{end - 1})")


def _stream_chunks(cons, ann: WeightAnnouncement, tmp: Path, timeout_s: float, cancelled) -> dict[str, str]:
    """Write chunks 0..n-1 as they arrive (one partition: in order), hashing each file on the way."""
    alg = announced_digest(ann)
    hashes: dict[str, digest.Hasher] = {}
    handle, handle_name, nxt = None, "", 0
    deadline = time.monotonic() + timeout_s
    try:
        while nxt < ann.num_chunks:
            if time.monotonic() > deadline:
                raise WeightsTimeout(f"weights v{ann.version}: {nxt}/{ann.num_chunks} chunks after {timeout_s}s")
            if cancelled():
                raise WeightsCancelled(f"weights v{ann.version}: stopped at chunk {nxt}/{ann.num_chunks}")
            for rec in cons.poll(timeout_s=0.5):
                c = rec.msg
                if c.model_name != ann.model_name or c.version != ann.version or c.index < nxt:
                    continue  # another version's chunks on the same partition, or a redelivered one
                if c.index != nxt or c.count != ann.num_chunks:
                    raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index}/{c.count} where {nxt}/"
                                         f"{ann.num_chunks} was due")
                if digest.hexdigest(alg, c.data) != c.sha256:
                    raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} fails its {alg}")
                if c.file_name != handle_name:
                    if handle is not None:
                        handle.close()
                    if c.file_name in hashes or "/" in c.file_name or c.file_name.startswith("."):
                        raise WeightsCorrupt(f"weights v{ann.version}: unexpected file {c.file_name!r}")
                    handle, handle_name = open(tmp / c.file_name, "wb"), c.file_name  # noqa: SIM115 - closed at the next file or the end
                    hashes[c.file_name] = digest.hasher(alg)
                if c.offset != handle.tell():
                    raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} at offset {c.offset}, "
                                         f"expected {handle.tell()}")
                handle.write(c.data)
                hashes[c.file_name].update(c.data)
                nxt += 1
                if nxt == ann.num_chunks:
                    break
    finally:
        if handle is not None:
            handle.close()
    return {n: h.hexdigest() for n, h in hashes.items()}


class VersionGate:
    """Receiver-side monotonicity: a version is taken only if newer than the last one applied."""

    def __init__(self, applied: int = 0) -> None:
        self.applied = applied

    def wants(self, ann: WeightAnnouncement) -> bool:
        return ann.version > self.applied

    def mark_applied(self, version: int) -> None:
        if version <= self.applied:
            raise KernelRLError(f"weights: version {version} is not newer than applied {self.applied}")
        self.applied = version
