"""A policy version on disk: its folder, its manifest and digests, and atomic ``fs`` publishing.

The shared ground of cluster.weights.transport (kafka/fs) and cluster.weights.stream (nccl), which both
import it (and nothing of each other's but the stream receiver): a version lives in
``<root>/<model>/v<version>`` with a ``MANIFEST.json``; its digest is a hash over the
"<name> <file hash>" lines in name order, all of the algorithm the manifest's "digest" names
(cluster.weights.digest: blake3 for what is published now; a manifest without it is sha256); a folder is
published by writing a temporary folder and renaming it, so a half-written version is never seen (fsynced before
the rename, or after it off the publisher's hot path: ``publish_fs``'s ``sync``).
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from cluster.errors import KernelRLError
from cluster.weights import digest
from schemas.messages import WeightAnnouncement

MANIFEST = "MANIFEST.json"
log = logging.getLogger(__name__)


class WeightsCorrupt(KernelRLError):
    """A version's bytes do not match their checksums: it must not be applied."""


class WeightsMissing(WeightsCorrupt):
    """The announced location does not hold the version (no folder; chunks the log does not have, as for a
    half-sent version): it must not be applied, and waiting will not help."""


def version_dir(root: str | os.PathLike, model_name: str, version: int) -> Path:
    return Path(root) / model_name / f"v{version:08d}"


def prune_versions(root: str | os.PathLike, model_name: str, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` version folders of ``model_name`` under ``root`` (keep <= 0: none are
    deleted); returns what was deleted. Half-written temp folders (hidden) are their writers' to remove."""
    if keep <= 0:
        return []
    versions = sorted((Path(root) / model_name).glob("v[0-9]*"))
    for old in versions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return versions[:-keep]


EXPORT_PREFIX = ".krl-export-"  # a learner's export beside its versions (learner/publish.py), hidden from readers


def remove_leftovers(root: str | os.PathLike, model_name: str) -> list[Path]:
    """Delete what a publisher killed mid-way left under ``<root>/<model>``: exports and half-written version
    folders (both hidden, so never read); called by the one publisher of the model when it starts."""
    gone = [p for p in (Path(root) / model_name).glob(".*") if p.is_dir()
            and (p.name.startswith(EXPORT_PREFIX) or p.name.startswith(".v"))]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def version_files(folder: Path) -> list[Path]:
    """The files a version consists of (the manifest and hidden files are not part of it)."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST and not p.name.startswith("."))


def announced_digest(ann: WeightAnnouncement) -> str:
    """The algorithm of ``ann``'s hashes; one this kernelrl does not know makes the version corrupt (never applied)."""
    try:
        return digest.check(ann.digest)
    except ValueError as exc:
        raise WeightsCorrupt(f"weights v{ann.version}: {exc}") from None


def _hash_file(path: Path, alg: str) -> str:
    """Hashed from a read-only mapping: no copy out of the page cache (1.2 GB: 0.35 s against 0.48-0.58 s in
    8 MB reads on the 2-core CI box, docs/weights-bench.md)."""
    h = digest.hasher(alg)
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                h.update(m)
    return h.hexdigest()


def manifest_digest(files: dict[str, str], alg: str) -> str:
    """The version's digest: ``alg`` over "<name> <file digest>" lines in name order (covers every byte)."""
    return digest.hexdigest(alg, "".join(f"{n} {h}\n" for n, h in sorted(files.items())).encode())


def folder_digest(folder: str | os.PathLike, alg: str) -> tuple[dict[str, str], str, int]:
    """(file name -> ``alg`` digest, manifest digest, total bytes)."""
    per_file, total = {}, 0
    for p in version_files(Path(folder)):
        per_file[p.name] = _hash_file(p, alg)
        total += p.stat().st_size
    return per_file, manifest_digest(per_file, alg), total


def publish_fs(root: str | os.PathLike, model_name: str, version: int, folder: str | os.PathLike,
               step: int = 0, alg: str = digest.DEFAULT, take: bool = False, sync: bool = True) -> WeightAnnouncement:
    """Copy ``folder`` into <root>/<model>/v<version> atomically (tmp + rename), with a manifest; every hash of
    the version is ``alg``'s. ``take``: the caller gives ``folder`` up (the learner's fresh export), so its files
    are hard-linked, not copied, where both lie on one filesystem. ``sync``: the files are on disk (fsync) before
    this returns; otherwise they are synced on a thread of their own (``wait_durable``) and the version is
    announced from the page cache, which a process's crash does not lose: an OS crash can, and a version found
    after a restart is verified before it is announced again (``existing_fs``)."""
    dest = version_dir(root, model_name, version)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".v{version:08d}.", dir=dest.parent))
    try:
        per_file, total = {}, 0
        for p in version_files(Path(folder)):
            per_file[p.name], n = _take_hashing(p, tmp / p.name, alg, sync) if take else \
                _copy_hashing(p, tmp / p.name, alg, sync)
            total += n
        ann = WeightAnnouncement(model_name=model_name, version=version, transport="fs",
                                 uri=str(dest.resolve()), num_chunks=len(per_file), total_bytes=total,
                                 sha256=manifest_digest(per_file, alg), files=per_file, step=step, digest=alg)
        if dest.exists():
            _check_reuse(dest, folder, ann)
            return ann
        _write_manifest(tmp, ann, sync)
        os.rename(tmp, dest)
        if sync:
            _fsync_dir(dest.parent)
        else:
            _sync_later(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ann


_syncing: list[threading.Thread] = []  # versions' fsync threads not yet seen finished
_syncing_lock = threading.Lock()


def _sync_later(dest: Path) -> None:
    t = threading.Thread(target=_sync_version, args=(dest,), name=f"fsync-{dest.name}", daemon=True)
    with _syncing_lock:  # finished ones dropped here: a learner publishes thousands of versions between waits
        _syncing[:] = [x for x in _syncing if x.is_alive()]
        _syncing.append(t)
    t.start()


def _sync_version(dest: Path) -> None:
    """Every file of a published version, then its folder and the model's folder, on disk."""
    try:
        for p in dest.iterdir():
            _fsync(p)
        _fsync_dir(dest)
        _fsync_dir(dest.parent)
    except OSError as exc:  # pruned meanwhile, or a disk error: the version is verified again after a restart
        log.warning("weights: syncing %s failed: %s", dest, exc)


def wait_durable(timeout_s: float | None = None) -> bool:
    """Wait for the versions published with ``sync=False`` to reach the disk; True when none is left."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    with _syncing_lock:
        pending = list(_syncing)
    for t in pending:
        t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            return False
    with _syncing_lock:
        _syncing[:] = [x for x in _syncing if x.is_alive()]
    return True


def _check_reuse(dest: Path, folder: str | os.PathLike, ann: WeightAnnouncement) -> None:
    """A version already under ``dest`` must hold ``folder``'s bytes (compared by its manifest's algorithm)."""
    have = json.loads((dest / MANIFEST).read_text())
    try:
        alg = digest.check(have.get("digest", digest.SHA256))
    except ValueError as exc:
        raise WeightsCorrupt(f"{dest}: its manifest: {exc}") from None
    whole = ann.sha256 if alg == ann.digest else folder_digest(folder, alg)[1]
    if have.get("sha256") != whole:
        raise WeightsCorrupt(f"{dest} already holds different bytes for version {ann.version}: versions "
                             "must not be reused")


def _copy_hashing(src: Path, dst: Path, alg: str, sync: bool = True, bufsize: int = 8 << 20) -> tuple[str, int]:
    h, n = digest.hasher(alg), 0
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while block := fi.read(bufsize):
            h.update(block)
            fo.write(block)
            n += len(block)
        fo.flush()
        if sync:
            os.fsync(fo.fileno())
    return h.hexdigest(), n


def _take_hashing(src: Path, dst: Path, alg: str, sync: bool) -> tuple[str, int]:
    """``src`` linked as ``dst`` (one filesystem; else copied) and hashed from the page cache."""
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links refused: copied instead
        return _copy_hashing(src, dst, alg, sync)
    if sync:
        _fsync(dst)
    return _hash_file(dst, alg), dst.stat().st_size


def _write_manifest(folder: Path, ann: WeightAnnouncement, sync: bool = True) -> None:
    with open(folder / MANIFEST, "w") as f:
        json.dump({"model_name": ann.model_name, "version": ann.version, "files": ann.files,
                   "sha256": ann.sha256, "digest": ann.digest, "total_bytes": ann.total_bytes}, f)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def existing_fs(root: str | os.PathLike, model_name: str, version: int, step: int = 0) -> WeightAnnouncement | None:
    """The announcement of a version already complete under ``root`` (after a restart), else None; its hashes
    are of the manifest's algorithm (sha256 for a manifest written before it named one). Its files are verified
    first: one published without waiting for the disk may have lost bytes to an OS crash; such a folder is
    removed (and None returned), so the version is exported again rather than announced broken."""
    dest = version_dir(root, model_name, version)
    try:
        have = json.loads((dest / MANIFEST).read_text())
        ann = WeightAnnouncement(model_name=model_name, version=version, transport="fs", uri=str(dest.resolve()),
                                 num_chunks=len(have["files"]), total_bytes=int(have["total_bytes"]),
                                 sha256=have["sha256"], files=dict(have["files"]), step=step,
                                 digest=have.get("digest", digest.SHA256))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        verify_folder(dest, ann)
    except (WeightsCorrupt, OSError) as exc:
        log.warning("weights: %s does not hold what its manifest says (%s): removed, to be published again", dest, exc)
        shutil.rmtree(dest, ignore_errors=True)
        return None
    return ann


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


def verify_folder(folder: str | os.PathLike, ann: WeightAnnouncement) -> None:
    """``folder`` holds exactly the announced files (hashed by the announcement's algorithm), or WeightsCorrupt."""
    per_file, whole, total = folder_digest(folder, announced_digest(ann))
    if per_file != ann.files or whole != ann.sha256 or total != ann.total_bytes:
        bad = sorted(n for n in set(per_file) | set(ann.files) if per_file.get(n) != ann.files.get(n))
        raise WeightsCorrupt(f"weights v{ann.version} at {folder}: checksum mismatch (files {bad or 'all'})")
