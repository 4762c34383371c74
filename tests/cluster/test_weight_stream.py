"""The ``nccl`` weight transport on CPU (gloo): receivers in other processes get bit-identical, verified
versions; a receiver that deserts or is SIGKILLed mid-transfer costs the server one transfer, never the
next; versions the learner no longer holds, unreachable servers and corrupt announcements are clear errors
and never materialise a folder."""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest

from cluster.weights import stream as ws
from cluster.weights import transport as wt
from tests.sockets import listening_sockets

from .weights_receiver import receive_in_child
from .weights_receiver import spawn as _child

def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in wt.version_files(folder)}


@pytest.fixture()
def src(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(6 * 1024 * 1024 + 7))
    (d / "config.json").write_text('{"model_type": "qwen2"}')
    (d / "empty.txt").write_text("")
    return d


def test_stream_to_other_processes_survives_deserters_and_kills(src, tmp_path):
    server = ws.WeightStreamServer(tmp_path / "served", backend="gloo", chunk_bytes=1 << 20, timeout_s=8)
    try:
        ann = server.add("policy", 1, src, step=5)
        assert ann.transport == "nccl" and ann.uri == f"nccl://127.0.0.1:{server.port}/policy/1" and ann.step == 5
        # a deserter and a receiver killed mid-transfer queue ahead of two honest receivers
        deserter = _child(ann, tmp_path / "r0", "desert")
        assert deserter.wait(60) == 0
        dying = _child(ann, tmp_path / "r1", "die")
        assert dying.wait(60) == -9
        honest = [_child(ann, tmp_path / f"r{i}") for i in (2, 3)]
        outs = [p.communicate(timeout=120) for p in honest]
        assert [p.returncode for p in honest] == [0, 0], [e[-2000:] for _, e in outs]
        for (out, _), i in zip(outs, (2, 3)):
            got = Path(out.strip().splitlines()[-1])
            assert got == wt.version_dir(tmp_path / f"r{i}", "policy", 1)
            assert _bytes(got) == _bytes(src)
            assert json.loads((got / wt.MANIFEST).read_text())["sha256"] == ann.sha256
        assert not wt.version_dir(tmp_path / "r1", "policy", 1).exists()  # the killed one applied nothing
        assert (server.served, server.failed) == (2, 2) and server.by_backend == {"nccl": 0, "gloo": 2}
    finally:
        server.close()


def test_one_broadcast_serves_every_receiver_of_a_version(src, tmp_path):
    """Receivers that ask for a version together share one group: the bytes leave the server once. A deserter
    among them (asks, then leaves) is dropped at the offer and costs the others nothing; a receiver asking for
    another version gets a group of its own."""
    server = ws.WeightStreamServer(tmp_path / "served", backend="gloo", chunk_bytes=1 << 20, timeout_s=30,
                                   gather_s=3.0)
    sent = []
    real = ws._broadcast

    def counted(pg, t):  # the server's collectives (receivers run in their own processes)
        sent.append(t.numel())
        real(pg, t)

    try:
        v1 = server.add("policy", 1, src)
        (src / "config.json").write_text('{"model_type": "qwen2", "v": 2}')
        v2 = server.add("policy", 2, src)
        ws._broadcast = counted
        deserter = _child(v1, tmp_path / "d", "desert")
        kids = [_child(v1, tmp_path / f"r{i}") for i in range(3)] + [_child(v2, tmp_path / "other")]
        outs = [p.communicate(timeout=180) for p in kids]
        assert [p.returncode for p in kids] == [0] * 4, [e[-2000:] for _, e in outs]
        assert deserter.wait(60) == 0
        for (out, _), name, ann in zip(outs, ["r0", "r1", "r2", "other"], [v1, v1, v1, v2]):
            got = Path(out.strip().splitlines()[-1])
            assert got == wt.version_dir(tmp_path / name, "policy", ann.version)
            assert json.loads((got / wt.MANIFEST).read_text())["sha256"] == ann.sha256
        assert _bytes(wt.version_dir(tmp_path / "other", "policy", 2)) == _bytes(src)
        assert sorted(server.groups) == [1, 3] and (server.served, server.failed) == (4, 1)
        once = [sum(p.stat().st_size for p in wt.version_files(wt.version_dir(tmp_path / name, "policy", v)))
                for name, v in (("r0", 1), ("other", 2))]
        assert sum(sent) == sum(once)  # each version's bytes left the server once
    finally:
        ws._broadcast = real
        server.close()


def test_gone_unreachable_and_corrupt_versions_are_errors(src, tmp_path):
    server = ws.WeightStreamServer(tmp_path / "served", keep=2, chunk_bytes=1 << 20, timeout_s=8)
    try:
        anns = [server.add("policy", v, src) for v in (1, 2, 3)]
        assert sorted(p.name for p in (tmp_path / "served" / "policy").iterdir()) == ["v00000002", "v00000003"]
        with pytest.raises(ws.WeightsGone, match="no longer held"):
            wt.receive(None, anns[0], tmp_path / "recv", timeout_s=20)
        bad = dataclasses.replace(anns[2], files={**anns[2].files, "config.json": "0" * 64})
        with pytest.raises(wt.WeightsCorrupt):
            wt.receive(None, bad, tmp_path / "recv", timeout_s=20)
        assert not wt.version_dir(tmp_path / "recv", "policy", 3).exists()
        assert [p.name for p in (tmp_path / "recv" / "policy").iterdir()] == []  # no temp folders left
        assert _bytes(wt.receive(None, anns[2], tmp_path / "recv", timeout_s=20)) == _bytes(src)
        # a restarted learner serves the versions it kept under a new address
        again = ws.WeightStreamServer(tmp_path / "served", timeout_s=8)
        try:
            have = wt.existing_fs(tmp_path / "served", "policy", 2)
            moved = again.announcement(have)
            assert moved.uri.endswith(f":{again.port}/policy/2") and moved.sha256 == anns[1].sha256
            assert _bytes(wt.receive(None, moved, tmp_path / "recv2", timeout_s=20)) == _bytes(src)
        finally:
            again.close()
    finally:
        server.close()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nowhere = dataclasses.replace(anns[2], uri=f"nccl://127.0.0.1:{port}/policy/3")
    with pytest.raises(ws.WeightsUnreachable):
        wt.receive(None, nowhere, tmp_path / "recv3", timeout_s=3)
    assert not wt.version_dir(tmp_path / "recv3", "policy", 3).exists()


def test_version_pruned_mid_transfer_still_arrives_whole(src, tmp_path):
    server = ws.WeightStreamServer(tmp_path / "served", keep=1, chunk_bytes=1 << 20, timeout_s=30)
    try:
        ann = server.add("policy", 1, src)
        slow = _child(ann, tmp_path / "r", "slow")
        assert slow.stdout.readline().strip() == "STREAMING"
        server.add("policy", 2, src)  # keep=1: v1's folder is deleted while it is being streamed
        assert not wt.version_dir(tmp_path / "served", "policy", 1).exists()
        out, err = slow.communicate(timeout=120)
        assert slow.returncode == 0, err[-2000:]
        assert _bytes(Path(out.strip().splitlines()[-1])) == _bytes(src)
    finally:
        server.close()


def test_close_drains_for_late_receivers(src, tmp_path):
    server = ws.WeightStreamServer(tmp_path / "served", timeout_s=8)
    ann = server.add("policy", 1, src)
    closer = threading.Thread(target=server.close, args=(3.0,))
    closer.start()  # a learner ending right after its last publish
    time.sleep(1.0)  # actors read the announcement a moment later
    got = wt.receive(None, ann, tmp_path / "recv", timeout_s=20)
    closer.join(30)
    assert not closer.is_alive() and server.served == 1 and _bytes(got) == _bytes(src)
    with pytest.raises(ws.WeightsUnreachable):
        wt.receive(None, ann, tmp_path / "recv2", timeout_s=3)


def test_backend_choice_is_validated(monkeypatch):
    import torch

    from cluster.config import ConfigError, Config, validate
    from cluster.errors import SetupError

    cfg = Config()
    cfg.learner.weight_stream_backend = "mpi"
    with pytest.raises(ConfigError, match="learner.weight_stream_backend"):
        validate(cfg)
    cfg.learner.weight_stream_backend, cfg.learner.weight_stream_port = "auto", 70000
    with pytest.raises(ConfigError, match="learner.weight_stream_port"):
        validate(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a process without a GPU
    with pytest.raises(SetupError, match="needs a GPU"):
        ws.resolve_backend("nccl")
    assert ws.resolve_backend("auto") == "gloo" and ws.gpu_uuid() == ""
    # per transfer: NCCL only between two different GPUs
    assert ws.pick_backend("nccl", "GPU-a", ["GPU-b"]) == "nccl"
    assert ws.pick_backend("nccl", "GPU-a", ["GPU-b", "GPU-c"]) == "nccl"
    assert ws.pick_backend("nccl", "GPU-a", ["GPU-a"]) == "gloo"  # learner and actor on one GPU
    assert ws.pick_backend("nccl", "GPU-a", ["GPU-b", "GPU-b"]) == "gloo"  # two actors on one GPU
    assert ws.pick_backend("nccl", "GPU-a", ["GPU-b", ""]) == "gloo"  # a receiver without a GPU
    assert ws.pick_backend("gloo", "GPU-a", ["GPU-b"]) == "gloo"


def listening(port: int) -> set[str]:
    """The local addresses this process listens on with TCP port ``port``."""
    return {addr for addr, p in listening_sockets() if p == port}


def test_servers_listen_on_the_configured_address_only(src, tmp_path):
    """The weight store binds learner.weight_stream_host alone (TCPStore on its own binds every interface),
    announces it, and serves through it; the metrics endpoint binds loopback."""
    from cluster import metrics
    from cluster.config import ConfigError, Config, validate

    server = ws.WeightStreamServer(tmp_path / "served", host="127.0.0.2", backend="gloo", timeout_s=8)
    try:
        assert listening(server.port) == {"127.0.0.2"}
        ann = server.add("policy", 1, src)
        assert ann.uri == f"nccl://127.0.0.2:{server.port}/policy/1"
        with pytest.raises(ConnectionRefusedError):  # not on the other loopback address, nor on any other
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
        assert _bytes(wt.receive(None, ann, tmp_path / "recv", timeout_s=20)) == _bytes(src)
    finally:
        server.close()
    default = ws.WeightStreamServer(tmp_path / "served2", backend="gloo", timeout_s=8)
    try:
        assert listening(default.port) == {"127.0.0.1"}
    finally:
        default.close()
    http = metrics.serve(0, registry=metrics.Registry())
    try:
        assert listening(http.server_address[1]) == {"127.0.0.1"}
    finally:
        http.shutdown()
        http.server_close()
    cfg = Config()
    for wildcard in ("0.0.0.0", "::", ""):
        cfg.learner.weight_stream_host = wildcard
        with pytest.raises(ConfigError, match="learner.weight_stream_host"):
            validate(cfg)
    with pytest.raises(ws.SetupError, match="learner.weight_stream_host/port 192.0.2.1"):  # not this machine's
        ws.WeightStreamServer(tmp_path / "served3", host="192.0.2.1", backend="gloo", timeout_s=8)


@pytest.mark.gpu
def test_stream_over_nccl_between_two_gpus(src, tmp_path):
    """The NCCL backend: the server on GPU 0, the receiver a process that sees only GPU 1 (NCCL refuses two
    ranks on one GPU, so this needs the two-GPU machine: `make test-gpu GPU_TESTS=tests/cluster/test_weight_stream.py`);
    then a receiver on GPU 0 itself, which gets gloo."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.fail(f"needs 2 GPUs (NCCL cannot pair two ranks on one), this machine has {torch.cuda.device_count()}")
    torch.cuda.set_device(0)
    server = ws.WeightStreamServer(tmp_path / "served", backend="nccl", chunk_bytes=1 << 20, timeout_s=60)
    try:
        ann = server.add("policy", 1, src)
        assert _bytes(receive_in_child(ann, tmp_path / "r", CUDA_VISIBLE_DEVICES="1")) == _bytes(src)
        # a receiver on the server's own GPU falls back to gloo instead of failing
        assert _bytes(receive_in_child(ann, tmp_path / "s", CUDA_VISIBLE_DEVICES="0")) == _bytes(src)
        assert (server.backend, server.served, server.failed) == ("nccl", 2, 0)
        assert server.by_backend == {"nccl": 1, "gloo": 1}
    finally:
        server.close()


def test_bench_fanout_serves_the_receivers_in_one_group_then_one_by_one(src, tmp_path):
    """`kernelrl bench weights receivers=N`'s measurement: N receiver processes get the version in one group,
    then N more one at a time; both verified (a receiver that fails fails the bench)."""
    from cluster.weights.bench_stream import run_fanout

    got = run_fanout(src, 2, tmp_path, chunk_bytes=1 << 20, backend="gloo")
    assert got["groups_together"] == [2] and got["receivers"] == 2 and got["backend"] == "gloo"
    assert got["bytes"] == sum(p.stat().st_size for p in wt.version_files(src))
    assert got["together_s"] > 0 and got["one_by_one_s"] > 0 and got["speedup"] > 0
    assert not list(tmp_path.glob("together-*")) and not list(tmp_path.glob("single-*"))
