"""The learner's bucket export (learner/export_buckets.py): the policy's tensors copied straight into two reused
host slots as safetensors, read back bit-identical by safetensors itself, ZeRO-3's partitioned parameters
gathered a bucket at a time."""
from __future__ import annotations

import pytest

from learner.export_buckets import BucketExporter, Entry, header, plan

from .conftest import learner_cfg


def _load(view) -> dict:
    from safetensors.torch import load

    return load(bytes(view))


def _model(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.add_(0.5)
    return model


def test_plan_keeps_order_and_never_splits_a_tensor():
    es = [Entry(f"t{i}", (n,), "float32", 4 * n) for i, n in enumerate([10, 10, 100, 5, 5])]
    groups = plan(es, 80)
    assert [[e.name for e in g] for g in groups] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    assert plan([], 80) == []


def test_the_header_is_what_safetensors_reads():
    import torch
    from safetensors.torch import load

    a, b = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), torch.tensor([1, -2], dtype=torch.int64)
    group = [Entry("a", (2, 3), "bfloat16", 12), Entry("b", (2,), "int64", 16)]
    head = header(group)
    assert len(head) % 8 == 0
    data = head + a.view(torch.uint8).numpy().tobytes() + b.view(torch.uint8).numpy().tobytes()
    got = load(data)
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b)
    with pytest.raises(ValueError, match="no safetensors name"):
        header([Entry("c", (1,), "complex64", 8)])


def test_buckets_hold_the_checkpoints_tensors_and_the_slots_are_reused(tiny_model):
    import torch

    model = _model(tiny_model)
    want = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied to the embedding
    ex = BucketExporter(64 * 1024)
    got = {}
    for v in ex.buckets(model):  # each view is read before the next is asked for (its slot is then refilled)
        got.update(_load(v))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert ex.stats["buckets"] > 2
    slots = [s.data_ptr() for s in ex._slots]
    with torch.no_grad():
        model.model.norm.weight.mul_(2)
    again = {}
    for v in ex.buckets(model):
        again.update(_load(v))
    assert [s.data_ptr() for s in ex._slots] == slots  # no new allocation for the next version
    assert torch.equal(again["model.norm.weight"], model.model.norm.weight)


def test_zero3_gathers_each_bucket_and_exports_the_whole_tensors(ds_process, tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from learner.trainer import Trainer

    tr = Trainer(learner_cfg(ds_process, zero_stage=3), tiny_model)
    module = tr.policy_module()
    assert any(getattr(p, "ds_numel", 0) and p.numel() == 0 for p in module.parameters())  # really partitioned
    got = {}
    for v in BucketExporter(64 * 1024).buckets(module, zero_stage=3, rank=0):
        got.update(_load(v))
    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    want = {k: v for k, v in base.items() if k != "lm_head.weight"}
    assert sorted(got) == sorted(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert all(p.numel() == 0 for p in module.parameters() if getattr(p, "ds_numel", 0))  # partitioned again

