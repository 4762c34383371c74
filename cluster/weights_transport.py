"""Moving a policy version (a Hugging Face folder) from the learner to the actors, verified.

Neutral ground for both sides: the learner publishes with ``publish_kafka`` /
``publish_fs`` and then ``announce``s; an actor calls ``receive`` on a
``WeightAnnouncement`` and gets a local folder whose every byte was checked
(per-chunk sha256, per-file sha256, and one sha256 over all files in name
order), or an error. A version is announced only after all its bytes are
durable, and a receiver writes into a temporary folder renamed at the end, so a
half-sent or corrupt version is never applied. ``VersionGate`` keeps versions
monotonic on the receiving side.

Kafka layout: every chunk of one version goes to one partition of
topics.WEIGHTS_CHUNKS (key = "<model>:<version>"), in file-name then byte
order; the announcement's ``uri`` is ``kafka://<topic>/<partition>@<first offset>``
so a receiver seeks straight to it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from cluster.errors import KernelRLError, RetriableError, SetupError
from schemas import topics
from schemas.messages import WeightAnnouncement, WeightChunk

log = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
_URI = re.compile(r"^kafka://(?P<topic>[^/]+)/(?P<partition>\d+)@(?P<offset>\d+)$")


class WeightsCorrupt(KernelRLError):
    """A version's bytes do not match their checksums: it must not be applied."""


class WeightsTimeout(RetriableError):
    """Not all chunks of a version arrived in time."""


def version_dir(root: str | os.PathLike, model_name: str, version: int) -> Path:
    return Path(root) / model_name / f"v{version:08d}"


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def _sha_file(path: Path, bufsize: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(bufsize):
            h.update(block)
    return h.hexdigest()


def folder_digest(folder: str | os.PathLike) -> tuple[dict[str, str], str, int]:
    """(file name -> sha256, sha256 over all files in name order, total bytes)."""
    folder = Path(folder)
    whole, per_file, total = hashlib.sha256(), {}, 0
    for p in _files(folder):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            while block := f.read(8 << 20):
                h.update(block)
                whole.update(block)
                total += len(block)
        per_file[p.name] = h.hexdigest()
    return per_file, whole.hexdigest(), total


# ---- publishing ---------------------------------------------------------------------------
def publish_kafka(producer, model_name: str, version: int, folder: str | os.PathLike, chunk_bytes: int,
                  step: int = 0, timeout_s: float = 120.0) -> WeightAnnouncement:
    """Send every file of ``folder`` as WeightChunks; return the (not yet sent) announcement."""
    folder = Path(folder)
    files = _files(folder)
    count = sum(max(1, -(-p.stat().st_size // chunk_bytes)) for p in files)
    key = f"{model_name}:{version}"
    whole, per_file, total, index, futures = hashlib.sha256(), {}, 0, 0, []
    for p in files:
        fh = hashlib.sha256()
        with open(p, "rb") as f:
            offset = 0
            while True:
                data = f.read(chunk_bytes)
                if not data and offset > 0:
                    break
                fh.update(data)
                whole.update(data)
                futures.append(producer.send(topics.WEIGHTS_CHUNKS, WeightChunk(
                    model_name=model_name, version=version, index=index, count=count, file_name=p.name,
                    offset=offset, data=data, sha256=hashlib.sha256(data).hexdigest()), key=key))
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
    first = metas[0]
    uri = f"kafka://{topics.WEIGHTS_CHUNKS}/{first.partition}@{first.offset}"
    return WeightAnnouncement(model_name=model_name, version=version, transport="kafka", uri=uri,
                              num_chunks=count, total_bytes=total, sha256=whole.hexdigest(), files=per_file,
                              step=step)


def publish_fs(root: str | os.PathLike, model_name: str, version: int, folder: str | os.PathLike,
               step: int = 0) -> WeightAnnouncement:
    """Copy ``folder`` into <root>/<model>/v<version> atomically (tmp + rename), with a manifest."""
    dest = version_dir(root, model_name, version)
    per_file, whole, total = folder_digest(folder)
    ann = WeightAnnouncement(model_name=model_name, version=version, transport="fs", uri=str(dest.resolve()),
                             num_chunks=len(per_file), total_bytes=total, sha256=whole, files=per_file, step=step)
    if dest.exists():
        have = json.loads((dest / MANIFEST).read_text())
        if have.get("sha256") != whole:
            raise WeightsCorrupt(f"{dest} already holds different bytes for version {version}: versions must "
                                 "not be reused")
        return ann
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version:08d}.", dir=dest.parent))
    try:
        for p in _files(Path(folder)):
            shutil.copyfile(p, tmp / p.name)
            _fsync(tmp / p.name)
        (tmp / MANIFEST).write_text(json.dumps({"model_name": model_name, "version": version, "files": per_file,
                                                "sha256": whole, "total_bytes": total}))
        _fsync(tmp / MANIFEST)
        os.rename(tmp, dest)
        _fsync_dir(dest.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ann


def publish_nccl(*_args, **_kw):
    raise SetupError("learner.weight_transport 'nccl' is not implemented yet: use 'kafka' or 'fs'")


def announce(producer, ann: WeightAnnouncement, timeout_s: float = 60.0) -> None:
    """Publish the announcement (after every byte is durable) and wait for its ack."""
    producer.send(topics.WEIGHTS, ann, key=ann.model_name).get(timeout=timeout_s)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync(path)
    except OSError:  # some filesystems refuse fsync on directories; the rename is still atomic
        pass


# ---- receiving ----------------------------------------------------------------------------
def verify_folder(folder: str | os.PathLike, ann: WeightAnnouncement) -> None:
    per_file, whole, total = folder_digest(folder)
    if per_file != ann.files or whole != ann.sha256 or total != ann.total_bytes:
        bad = sorted(n for n in set(per_file) | set(ann.files) if per_file.get(n) != ann.files.get(n))
        raise WeightsCorrupt(f"weights v{ann.version} at {folder}: checksum mismatch (files {bad or 'all'})")


def receive(bus, ann: WeightAnnouncement, dest_root: str | os.PathLike, timeout_s: float = 120.0) -> Path:
    """Materialise and verify the announced version locally; returns the folder to load."""
    if ann.transport == "fs":
        verify_folder(ann.uri, ann)
        return Path(ann.uri)
    if ann.transport == "kafka":
        return _receive_kafka(bus, ann, dest_root, timeout_s)
    if ann.transport == "nccl":
        publish_nccl()
    raise WeightsCorrupt(f"weights v{ann.version}: unknown transport {ann.transport!r}")


def _receive_kafka(bus, ann: WeightAnnouncement, dest_root, timeout_s: float) -> Path:
    from kafka import TopicPartition

    m = _URI.match(ann.uri)
    if not m:
        raise WeightsCorrupt(f"weights v{ann.version}: bad kafka uri {ann.uri!r}")
    dest = version_dir(dest_root, ann.model_name, ann.version)
    if dest.exists():
        verify_folder(dest, ann)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    topic, part, start = m["topic"], int(m["partition"]), int(m["offset"])
    cons = bus.consumer([topic], None, assign=[(topic, part)], expected=WeightChunk, dlq=False,
                        enable_auto_commit=False)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{ann.version:08d}.", dir=dest.parent))
    try:
        cons.kafka.seek(TopicPartition(bus.topic(topic), part), start)
        chunks = _collect(cons, ann, timeout_s)
        whole = hashlib.sha256()
        for c in chunks:
            whole.update(c.data)
            with open(tmp / c.file_name, "r+b" if (tmp / c.file_name).exists() else "wb") as f:
                f.seek(c.offset)
                f.write(c.data)
        if whole.hexdigest() != ann.sha256:
            raise WeightsCorrupt(f"weights v{ann.version}: sha256 over chunks does not match the announcement")
        verify_folder(tmp, ann)
        (tmp / MANIFEST).write_text(json.dumps({"model_name": ann.model_name, "version": ann.version,
                                                "files": ann.files, "sha256": ann.sha256,
                                                "total_bytes": ann.total_bytes}))
        os.rename(tmp, dest)
    finally:
        cons.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _collect(cons, ann: WeightAnnouncement, timeout_s: float) -> list[WeightChunk]:
    got: dict[int, WeightChunk] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < ann.num_chunks:
        if time.monotonic() > deadline:
            raise WeightsTimeout(f"weights v{ann.version}: {len(got)}/{ann.num_chunks} chunks after {timeout_s}s")
        for rec in cons.poll(timeout_s=0.5):
            c = rec.msg
            if c.model_name != ann.model_name or c.version != ann.version:
                continue  # another version's chunks interleaved on the same partition
            if c.count != ann.num_chunks or not 0 <= c.index < c.count:
                raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index}/{c.count}, announced "
                                     f"{ann.num_chunks}")
            if hashlib.sha256(c.data).hexdigest() != c.sha256:
                raise WeightsCorrupt(f"weights v{ann.version}: chunk {c.index} fails its sha256")
            got.setdefault(c.index, c)
    return [got[i] for i in range(ann.num_chunks)]


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
