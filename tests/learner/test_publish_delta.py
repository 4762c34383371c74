"""The learner with learner.weight_compression = "xor-delta": its first version goes out as full buckets only,
the next one also as deltas against it, and a receiver holding the first decodes the second from them
bit-identical to the policy's tensors."""
from __future__ import annotations

from cluster.weights import buckets as wb
from cluster.weights import codec

from .conftest import learner_cfg


def test_second_version_goes_out_as_deltas_too(tiny_model, cfg, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from cluster.bus.client import Bus
    from learner.publish import Publisher

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    cfg = learner_cfg(cfg, weight_layout="buckets", weight_compression="xor-delta", weight_bucket_bytes=1 << 20,
                      chunk_bytes=200_000)
    opened = []
    real_open = wb._open_deltas
    monkeypatch.setattr(wb, "_open_deltas", lambda *a: opened.append(a[1].version) or real_open(*a))
    held, got = wb.HeldBuckets(), {}
    with Bus(cfg, client_id="learner-test") as bus:
        prod = bus.producer()
        try:
            pub = Publisher(cfg, prod)
            a1, _ = pub.publish(model, version=1, step=1, base_path=tiny_model)
            wb.receive_buckets(bus, a1, lambda i, data: None, timeout_s=60, held=held)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(1e-5 * torch.sign(torch.randn_like(p)))
            a2, _ = pub.publish(model, version=2, step=2, base_path=tiny_model)
        finally:
            prod.close()
        assert a1.delta_codec == codec.CODEC and a1.delta_chunks == 0
        assert a2.delta_chunks > 0 and set(a2.delta_base) == {1} and wb.wire_ratio(a2) > 1.3
        wb.receive_buckets(bus, a2, lambda i, data: got.update(wb.tensors_of(data)), timeout_s=60, held=held)
    assert opened == [2] and held.version == 2
    want = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
