"""Weight digests (cluster.weights.digest): blake3 for new versions, sha256 still verified for older ones.

Known vectors, streaming == one-shot, the threaded blake3 == the plain one, a clear error for an unknown
algorithm or a missing blake3 module; fs manifests name their algorithm (one without is sha256) and a version
kept under an older algorithm is still verified and not rewritten; on the real broker a blake3 version arrives
verified, a corrupt chunk or bucket is refused, a sha256 (older) announcement is still accepted, and a reader
that drops ``digest`` (older than schema 3) refuses a blake3 version: it fails closed."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from cluster.errors import SetupError
from cluster.weights import buckets as wb
from cluster.weights import digest
from cluster.weights import transport as wt
from cluster.weights.fs import WeightsCorrupt
from schemas import codec
from schemas.messages import WeightAnnouncement

BLAKE3_EMPTY = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
SHA256_ABC = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


# ---- the algorithms ---------------------------------------------------------------------------------------------
def test_known_vectors():
    assert digest.hexdigest("blake3", b"") == BLAKE3_EMPTY
    assert digest.hexdigest("sha256", b"abc") == SHA256_ABC
    h = digest.hasher("blake3")
    h.update(b"")
    assert h.hexdigest() == BLAKE3_EMPTY
    assert digest.DEFAULT == "blake3"


@pytest.mark.parametrize("alg", ["blake3", "sha256"])
def test_streaming_equals_one_shot(alg):
    data = os.urandom(3 * digest.THREADED_MIN + 12345)
    h = digest.hasher(alg)
    for off in range(0, len(data), 700_000):
        h.update(memoryview(data)[off:off + 700_000])
    assert h.hexdigest() == digest.hexdigest(alg, data) == digest.hexdigest(alg, bytearray(data))


def test_large_buffer_threaded_equals_unthreaded():
    import blake3

    big = os.urandom(8 * digest.THREADED_MIN + 1)
    assert digest.hexdigest("blake3", big) == blake3.blake3(big, max_threads=1).hexdigest()
    small = big[:digest.THREADED_MIN - 1]
    assert digest.hexdigest("blake3", small) == blake3.blake3(small, max_threads=blake3.blake3.AUTO).hexdigest()


@pytest.mark.parametrize("alg", ["md5", "", "BLAKE3"])
def test_unknown_algorithm_is_a_clear_error(alg):
    with pytest.raises(ValueError, match=f"unknown weight digest algorithm {alg!r}: expected one of blake3, sha256"):
        digest.hexdigest(alg, b"x")
    with pytest.raises(ValueError, match="expected one of blake3, sha256"):
        digest.hasher(alg)


def test_missing_blake3_module_says_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "blake3", None)  # `import blake3` raises ImportError
    with pytest.raises(SetupError, match="install it"):
        digest.hexdigest("blake3", b"x")
    assert digest.hexdigest("sha256", b"abc") == SHA256_ABC  # sha256 needs no blake3


# ---- fs: manifests and their algorithm --------------------------------------------------------------------------
def _folder(path, payload: bytes = b"weights" * 1000):
    path.mkdir()
    (path / "model.safetensors").write_bytes(payload)
    (path / "config.json").write_text("{}")
    return path


def _manifest(ann: WeightAnnouncement) -> dict:
    return json.loads((Path(ann.uri) / wt.MANIFEST).read_text())


def test_fs_version_is_blake3_and_its_manifest_says_so(tmp_path):
    src = _folder(tmp_path / "src")
    ann = wt.publish_fs(tmp_path / "fs", "p", 1, src)
    assert ann.digest == "blake3"
    assert ann.files["config.json"] == digest.hexdigest("blake3", b"{}")
    man = _manifest(ann)
    assert (man["digest"], man["sha256"], man["files"]) == ("blake3", ann.sha256, ann.files)
    assert wt.receive(None, ann, tmp_path / "recv") == Path(ann.uri)  # verified in place
    kept = wt.existing_fs(tmp_path / "fs", "p", 1)  # as a restarted learner reads it
    assert (kept.digest, kept.sha256, kept.files) == ("blake3", ann.sha256, ann.files)
    (Path(ann.uri) / "model.safetensors").write_bytes(b"weightz" * 1000)  # same size, other bytes
    with pytest.raises(WeightsCorrupt, match="checksum mismatch"):
        wt.receive(None, ann, tmp_path / "recv")


def test_older_sha256_manifest_still_verifies_and_is_not_rewritten(tmp_path):
    src = _folder(tmp_path / "src")
    old = wt.publish_fs(tmp_path / "fs", "p", 1, src, alg="sha256")
    assert old.digest == "sha256" and old.files["config.json"] == hashlib.sha256(b"{}").hexdigest()
    man_path = Path(old.uri) / wt.MANIFEST
    man = json.loads(man_path.read_text())
    del man["digest"]  # as written before manifests named their algorithm
    man_path.write_text(json.dumps(man))
    kept = wt.existing_fs(tmp_path / "fs", "p", 1)
    assert (kept.digest, kept.sha256, kept.files) == ("sha256", old.sha256, old.files)
    wt.verify_folder(kept.uri, kept)
    again = wt.publish_fs(tmp_path / "fs", "p", 1, src)  # same bytes, now hashed by blake3: accepted, kept
    assert again.digest == "blake3" and json.loads(man_path.read_text()) == man
    wt.verify_folder(again.uri, again)
    other = _folder(tmp_path / "other", b"different" * 1000)
    with pytest.raises(WeightsCorrupt, match="must not be reused"):
        wt.publish_fs(tmp_path / "fs", "p", 1, other)


def test_unknown_digest_in_an_announcement_is_corrupt(tmp_path):
    ann = wt.publish_fs(tmp_path / "fs", "p", 1, _folder(tmp_path / "src"))
    with pytest.raises(WeightsCorrupt, match="unknown weight digest algorithm 'md5'"):
        wt.verify_folder(ann.uri, dataclasses.replace(ann, digest="md5"))
    bad = WeightAnnouncement(model_name="p", version=2, transport="kafka", uri="kafka://x/0@0", num_chunks=1,
                             total_bytes=1, sha256=wb.bucket_digest(["a" * 64], "blake3"), layout="buckets",
                             buckets=["a" * 64], bucket_bytes=[1], digest="md5")
    with pytest.raises(WeightsCorrupt, match="unknown weight digest algorithm"):
        wb.check_announcement(bad)


def test_announcement_carries_its_digest_on_the_wire():
    ann = WeightAnnouncement(model_name="p", version=3, transport="fs", uri="/x", digest="blake3")
    assert codec.decode(codec.encode(ann), expected=WeightAnnouncement).digest == "blake3"


# ---- on the broker ----------------------------------------------------------------------------------------------
class _Corrupting:
    """A producer that flips one byte of chunk ``index``; with ``rehash`` its chunk hash is recomputed (only the
    bucket's hash in the announcement can catch it), without it the chunk's own hash does."""

    def __init__(self, prod, index: int, rehash: bool):
        self.prod, self.index, self.rehash = prod, index, rehash

    def send(self, topic, msg, key=None):
        if msg.index == self.index:
            data = bytearray(msg.data)
            data[len(data) // 2] ^= 0xFF
            msg = dataclasses.replace(msg, data=bytes(data))
            if self.rehash:
                msg = dataclasses.replace(msg, sha256=digest.hexdigest("blake3", msg.data))
        return self.prod.send(topic, msg, key=key)

    def flush(self, timeout_s):
        return self.prod.flush(timeout_s)


BUCKETS = [os.urandom(300_000), os.urandom(200_000), os.urandom(100_000)]  # chunks of 64 kB: 5, 4, 2


def _receive(bus, ann) -> list[bytes]:
    got: list[bytes] = []
    wb.receive_buckets(bus, ann, lambda i, data: got.append(data), timeout_s=60)
    return got


def test_buckets_blake3_verified_corrupt_refused_sha256_still_accepted(cfg):
    from cluster.bus.client import Bus

    with Bus(cfg, client_id="test-digest") as bus:
        prod = bus.producer()
        try:
            ann = wb.publish_kafka_buckets(prod, "p", 1, BUCKETS, chunk_bytes=65536)
            assert ann.digest == "blake3" and ann.buckets[1] == digest.hexdigest("blake3", BUCKETS[1])
            assert _receive(bus, codec.decode(codec.encode(ann))) == BUCKETS
            # a reader older than schema 3 drops ``digest`` and checks as sha256: it refuses the version
            with pytest.raises(WeightsCorrupt, match="does not match the announced digest"):
                _receive(bus, dataclasses.replace(ann, digest="sha256"))
            # a blake3 version's chunks carry no hash: a corrupt one is caught by its bucket's
            bad = wb.publish_kafka_buckets(_Corrupting(prod, 6, rehash=False), "p", 2, BUCKETS, chunk_bytes=65536)
            with pytest.raises(WeightsCorrupt, match="bucket 1 fails its announced blake3"):
                _receive(bus, bad)
            forged = wb.publish_kafka_buckets(_Corrupting(prod, 6, rehash=True), "p", 3, BUCKETS, chunk_bytes=65536)
            with pytest.raises(WeightsCorrupt, match="bucket 1 fails its announced blake3"):
                _receive(bus, forged)
            old = wb.publish_kafka_buckets(prod, "p", 4, BUCKETS, chunk_bytes=65536, alg="sha256")
            assert old.buckets[0] == hashlib.sha256(BUCKETS[0]).hexdigest()
            assert _receive(bus, old) == BUCKETS
            # a sha256 version keeps its per-chunk hashes (older readers check them): a corrupt chunk names itself
            old_bad = wb.publish_kafka_buckets(_Corrupting(prod, 6, rehash=False), "p", 5, BUCKETS, chunk_bytes=65536,
                                               alg="sha256")
            with pytest.raises(WeightsCorrupt, match="chunk 6 fails its sha256"):
                _receive(bus, old_bad)
        finally:
            prod.close()


def test_files_over_kafka_blake3_and_older_sha256_both_arrive(cfg, tmp_path):
    from cluster.bus.client import Bus

    src = _folder(tmp_path / "src", os.urandom(300_000))
    with Bus(cfg, client_id="test-digest-files") as bus:
        prod = bus.producer()
        try:
            new = wt.publish_kafka(prod, "p", 1, src, chunk_bytes=65536)
            old = wt.publish_kafka(prod, "p", 2, src, chunk_bytes=65536, alg="sha256")
            assert (new.digest, old.digest) == ("blake3", "sha256") and new.sha256 != old.sha256
            for ann in (new, old):
                got = wt.receive(bus, ann, tmp_path / "recv", timeout_s=30)
                assert (got / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
                assert json.loads((got / wt.MANIFEST).read_text())["digest"] == ann.digest
            older_reader = dataclasses.replace(new, digest="sha256")  # drops ``digest``: reads the hashes as sha256
            with pytest.raises(WeightsCorrupt, match="chunk 0 fails its sha256"):
                wt.receive(bus, older_reader, tmp_path / "recv-old", timeout_s=30)
            assert not wt.version_dir(tmp_path / "recv-old", "p", 1).exists()
        finally:
            prod.close()
