"""The learner's fs publish (cluster.weights.fs.publish_fs with take/sync off): its export's files are linked into
the version's folder, not copied; the fsync follows on a thread (wait_durable); and a version that lost bytes after
its publish (as an OS crash before that fsync could leave it) is not announced again by a restarted learner but
removed, so that it is exported anew; what a publisher killed mid-way left (its export, a half-written version) is
removed when the next one starts."""
from __future__ import annotations

import os
from pathlib import Path

from cluster.weights import transport as wt


def _export(folder: Path, payload: bytes = b"weights" * 100_000) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(payload)
    (folder / "config.json").write_text("{}")
    return folder


def test_a_taken_export_is_linked_hashed_and_synced_later(tmp_path):
    root = tmp_path / "fs"
    src = _export(root / "p" / ".krl-export-v1-x")  # where the learner exports: beside the versions, hidden
    ino = (src / "model.safetensors").stat().st_ino
    ann = wt.publish_fs(root, "p", 1, src, take=True, sync=False)
    assert wt.wait_durable(30.0)
    dest = Path(ann.uri)
    assert (dest / "model.safetensors").stat().st_ino == ino  # linked: no copy of the bytes
    wt.verify_folder(dest, ann)
    assert ann.files == wt.publish_fs(tmp_path / "copied", "p", 1, src).files  # the same hashes as a copy's
    assert sorted(p.name for p in (root / "p").iterdir() if not p.name.startswith(".")) == ["v00000001"]
    kept = wt.existing_fs(root, "p", 1)  # a restarted learner: verified, announced again
    assert (kept.sha256, kept.files) == (ann.sha256, ann.files)


def test_a_taken_folder_on_another_filesystem_is_copied(tmp_path, monkeypatch):
    src = _export(tmp_path / "src")

    def no_link(a, b):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    ann = wt.publish_fs(tmp_path / "fs", "p", 3, src, take=True, sync=True)
    dest = Path(ann.uri)
    assert (dest / "model.safetensors").stat().st_ino != (src / "model.safetensors").stat().st_ino
    wt.verify_folder(dest, ann)


def test_a_version_that_lost_bytes_is_removed_not_announced_again(tmp_path):
    src = _export(tmp_path / "src")
    ann = wt.publish_fs(tmp_path / "fs", "p", 2, src, sync=False)
    assert wt.wait_durable(30.0)
    with open(Path(ann.uri) / "model.safetensors", "r+b") as f:  # what an OS crash before the fsync may leave
        f.truncate(4096)
    assert wt.existing_fs(tmp_path / "fs", "p", 2) is None
    assert not Path(ann.uri).exists()
    again = wt.publish_fs(tmp_path / "fs", "p", 2, src)  # the learner exports and publishes it again
    assert again.sha256 == ann.sha256
    wt.verify_folder(again.uri, again)


def test_leftovers_of_a_killed_publisher_are_removed_and_versions_kept(tmp_path):
    ann = wt.publish_fs(tmp_path / "fs", "p", 1, _export(tmp_path / "src"))
    model = tmp_path / "fs" / "p"
    stale = [_export(model / f"{wt.EXPORT_PREFIX}v2-abc"), _export(model / ".v00000002.xyz")]
    from cluster.weights import fs as wfs

    assert sorted(wfs.remove_leftovers(tmp_path / "fs", "p")) == sorted(stale)
    assert not any(p.exists() for p in stale)
    wt.verify_folder(ann.uri, ann)  # the published version is untouched
