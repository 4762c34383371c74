"""The "buckets" layout on the real broker: `weights push --layout buckets` sends a folder's tensors as
verified in-memory buckets (bit-identical on arrival, several buckets, nothing written by the receiver);
an inconsistent announcement is refused before any fetch; a version-1 announcement still reads as a folder."""
from __future__ import annotations

import dataclasses
import json
import subprocess

import numpy as np
import pytest

from cluster.weights import buckets as wb
from cluster.weights.fs import WeightsCorrupt
from schemas import codec
from schemas.messages import WeightAnnouncement
from tests.conftest import KERNELRL, cfg_env


def test_weights_push_buckets_arrive_verified_in_memory(cfg, tmp_path):
    import torch
    from safetensors.numpy import save_file

    from cluster.bus.client import Bus
    from cluster.cmd_weights import announcements

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    want = {f"w{i}": np.random.default_rng(i).standard_normal(40_000).astype(np.float32) for i in range(5)}
    save_file(want, str(ckpt / "model.safetensors"))
    env = {**cfg_env(cfg), "KRL__LEARNER__WEIGHT_BUCKET_BYTES": "350000", "KRL__LEARNER__CHUNK_BYTES": "65536"}
    out = subprocess.run(KERNELRL + ["weights", "push", "--path", str(ckpt), "--layout", "buckets"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["layout"] == "buckets"
    with Bus(cfg, client_id="test-weights") as bus:
        (ann,) = announcements(bus, cfg.learner.model_name)
        assert ann.layout == "buckets" and len(ann.buckets) == 3 and ann.files == {}  # 160 kB tensors, 350 kB buckets
        assert ann.digest == "blake3"
        got = {}
        assert wb.receive_buckets(bus, ann, lambda i, data: got.update(wb.tensors_of(data)), timeout_s=60) == 3
        forged = dataclasses.replace(ann, buckets=[ann.buckets[0], "0" * 64, ann.buckets[2]])
        forged = dataclasses.replace(forged, sha256=wb.bucket_digest(forged.buckets, ann.digest))  # consistent, a lie
        seen = []
        with pytest.raises(WeightsCorrupt, match="bucket 1 fails its announced blake3"):
            wb.receive_buckets(bus, forged, lambda i, data: seen.append(i), timeout_s=60)
        assert seen == [0]
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], torch.from_numpy(v)) for k, v in want.items())
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    bad = subprocess.run(KERNELRL + ["weights", "push", "--path", str(ckpt), "--layout", "buckets", "--transport",
                                     "fs"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--layout buckets needs --transport kafka" in bad.stderr


@pytest.mark.parametrize("field", ["buckets", "bucket_bytes", "sha256", "transport", "digest"])
def test_inconsistent_bucket_announcement_is_refused_before_any_fetch(field):
    shas = ["a" * 64, "b" * 64]
    good = WeightAnnouncement(model_name="p", version=1, transport="kafka", uri="kafka://x/0@0", num_chunks=2,
                              total_bytes=30, sha256=wb.bucket_digest(shas, "blake3"), layout="buckets", buckets=shas,
                              bucket_bytes=[10, 20], digest="blake3")
    wb.check_announcement(good)
    wrong = {"buckets": shas[:1], "bucket_bytes": [10, 21], "sha256": "0" * 64, "transport": "fs", "digest": "sha256"}
    with pytest.raises(WeightsCorrupt):
        wb.check_announcement(dataclasses.replace(good, **{field: wrong[field]}))


def test_version_1_announcement_reads_as_a_folder():
    import msgpack

    new = WeightAnnouncement(model_name="p", version=4, transport="fs", uri="/x", files={"a": "0" * 64})
    body = msgpack.unpackb(codec.encode(new), raw=False)
    assert (body["v"], body["r"]) == (3, 1)  # readable by version-1 consumers
    body["v"] = 1
    for k in ("layout", "buckets", "bucket_bytes", "digest"):
        del body["d"][k]
    old = codec.decode(msgpack.packb(body, use_bin_type=True), expected=WeightAnnouncement)
    assert (old.layout, old.buckets, old.bucket_bytes, old.files) == ("files", [], [], {"a": "0" * 64})
    assert old.digest == "sha256"  # what a version-1 or -2 record's hashes are


def test_weights_stream_and_transport_share_weights_fs_without_a_cycle():
    """weights.transport imports weights.stream (the nccl receiver); weights.stream imports weights.fs (and the
    leaf weights.digest), never weights.transport, at module level or inside any function."""
    import ast
    from pathlib import Path

    def imported(mod: str) -> set[str]:
        tree = ast.parse((Path(__file__).resolve().parents[2] / "cluster" / "weights" / f"{mod}.py").read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        return names

    stream, transport, fs = imported("stream"), imported("transport"), imported("fs")
    assert "cluster.weights.fs" in stream and not any("weights.transport" in n for n in stream)
    assert "cluster.weights.stream" in transport
    assert not any("weights.stream" in n or "weights.transport" in n for n in fs)
