"""The learner's in-memory publishing (learner.weight_layout = "buckets"): the policy's tensors reach a
receiver over the real broker bit-identical, in several verified buckets, the tied LM head left out as a
checkpoint would, and no file is written; other transports refuse the layout."""
from __future__ import annotations

import tempfile

import pytest

from cluster.weights import buckets as wb
from cluster.errors import SetupError

from .conftest import learner_cfg


def test_buckets_from_memory_arrive_bit_identical(tiny_model, cfg, tmp_path, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from cluster.bus.client import Bus
    from learner.publish import Publisher

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.add_(0.25)  # not the base model's bytes
    cfg = learner_cfg(cfg, weight_layout="buckets", weight_bucket_bytes=1 << 20, chunk_bytes=200_000)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where an export folder would go
    with Bus(cfg, client_id="learner-test") as bus:
        prod = bus.producer()
        try:
            ann, secs = Publisher(cfg, prod).publish(model, version=3, step=9, base_path=tiny_model)
        finally:
            prod.close()
        assert ann.layout == "buckets" and ann.version == 3 and ann.step == 9 and ann.files == {}
        assert len(ann.buckets) == 3 and secs > 0
        got: dict = {}
        n = wb.receive_buckets(bus, ann, lambda i, data: got.update(wb.tensors_of(data)), timeout_s=60)
    assert n == 3
    want = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert list(tmp_path.iterdir()) == []  # nothing exported to disk


@pytest.mark.parametrize("transport", ["fs", "nccl"])
def test_buckets_need_kafka(transport, tmp_path):
    from learner.publish import Publisher

    cfg = learner_cfg(weight_layout="buckets", weight_transport=transport, weight_fs_dir=str(tmp_path))
    with pytest.raises(SetupError, match="needs weight_transport 'kafka'"):
        Publisher(cfg)
