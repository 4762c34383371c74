"""Delta-compressed in-memory versions (learner.weight_compression = "xor-delta", cluster.weights.codec): the
codec round-trips bytes exactly and sends a changed tensor list whole; on the real broker a receiver holding
v1 reads v2's delta section and gets v2 bit-for-bit, one without v1 reads v2's full buckets; a corrupt delta is
refused by its hash (blake3) and the actor keeps its old version, then takes the next one in full."""
from __future__ import annotations

import hashlib
import time

import pytest

from cluster.weights import buckets as wb
from cluster.weights import codec
from cluster.weights.fs import WeightsCorrupt

BUCKET, CHUNK = 350_000, 64 * 1024


def _state(seed: int, dtype_name: str = "float32") -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    return {f"layer.{i}.weight": (0.02 * torch.randn(200, 200, generator=g)).to(dtype) for i in range(6)}


def _stepped(state: dict, seed: int, lr: float = 1e-5) -> dict:
    """An Adam-like step: every weight moves by about lr, either way (computed in float32, stored as before)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in state.items():
        step = lr * torch.sign(torch.randn(v.shape, generator=g)) * (0.1 + 0.9 * torch.rand(v.shape, generator=g))
        out[k] = (v.float() + step).to(v.dtype)
    return out


def _bucket(state: dict) -> bytes:
    (data,) = wb.pack(sorted(state.items()), 1 << 30)
    return data


# ---- the codec --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_delta_round_trips_exact_bytes_and_compresses(dtype, shuffle):
    v1 = _state(1, dtype)
    old, new = _bucket(v1), _bucket(_stepped(v1, 2))
    assert old != new
    enc = codec.encode(new, old, shuffle=shuffle)
    assert enc is not None and len(enc) < len(new) / 1.3
    assert codec.decode(enc, old, codec.CODEC if shuffle else codec.PLAIN) == new


def test_mismatched_tensors_go_whole_and_a_wrong_base_fails_the_sha():
    import torch

    v1 = _state(1)
    v2 = dict(v1, **{"layer.0.weight": torch.zeros(100, 400)})  # same bytes, another shape
    assert codec.encode(_bucket(v2), _bucket(v1)) is None
    v3 = dict(v1, extra=torch.zeros(3))
    assert codec.encode(_bucket(v3), _bucket(v1)) is None  # another length
    enc = codec.DeltaEncoder()
    enc.begin()
    assert enc.entry(0, _bucket(v1)) == (-1, _bucket(v1))  # nothing held yet
    enc.commit(1, 1)
    enc.begin()
    base, data = enc.entry(0, _bucket(v2))
    assert (base, data) == (-1, _bucket(v2))
    enc.commit(2, 1)
    enc.begin()
    base, data = enc.entry(0, _bucket(_stepped(v2, 3)))
    assert base == 2 and codec.decode(data, _bucket(v2)) == _bucket(_stepped(v2, 3))
    wrong = codec.decode(data, _bucket(dict(v2, **{"layer.1.weight": v2["layer.1.weight"] + 1})))
    assert hashlib.sha256(wrong).digest() != hashlib.sha256(_bucket(_stepped(v2, 3))).digest()
    with pytest.raises(WeightsCorrupt, match="does not decompress"):
        codec.decode(b"\x00" * 64, _bucket(v2))
    with pytest.raises(WeightsCorrupt, match="unknown weight delta codec"):
        codec.decode(data, _bucket(v2), "xor-brotli")


def test_weight_compression_is_validated():
    from cluster.config import Config, ConfigError, set_value, validate

    cfg = Config()
    set_value(cfg, "learner.weight_compression", "gzip")
    with pytest.raises(ConfigError, match="learner.weight_compression: 'gzip' is not one of"):
        validate(cfg)
    set_value(cfg, "learner.weight_compression", "xor-delta")
    with pytest.raises(ConfigError, match="learner.weight_compression: 'xor-delta' needs learner.weight_layout"):
        validate(cfg)
    set_value(cfg, "learner.weight_layout", "buckets")
    validate(cfg)


# ---- on the broker ------------------------------------------------------------------------------
class _FlippingEncoder(codec.DeltaEncoder):
    """A learner whose delta of bucket 0 has one byte flipped inside a valid zstd frame (its size, and so the
    announcement and every chunk checksum, consistent): only the decoded bucket's hash can catch it."""

    def entry(self, i: int, data: bytes):
        import zstandard

        base, enc = super().entry(i, data)
        if i == 0 and base >= 0:
            raw = bytearray(zstandard.ZstdDecompressor().decompress(enc))
            raw[len(raw) // 2] ^= 0x01
            enc = zstandard.ZstdCompressor(level=1).compress(bytes(raw))
        return base, enc


def _publish(cfg, prod, enc, version: int, state: dict):
    from cluster.weights.transport import announce

    ann = wb.publish_kafka_buckets(prod, cfg.learner.model_name, version, wb.pack(sorted(state.items()), BUCKET),
                                   chunk_bytes=CHUNK, delta=enc)
    announce(prod, ann)
    return ann


def _receive(bus, ann, held) -> dict:
    got: dict = {}
    assert wb.receive_buckets(bus, ann, lambda i, data: got.update(wb.tensors_of(data)), timeout_s=60,
                              held=held) == len(ann.buckets)
    return got


def _same(got: dict, want: dict) -> bool:
    import torch

    return sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_delta_versions_on_the_broker_decode_bit_for_bit_or_fall_back_to_full(cfg, monkeypatch):
    import torch

    from cluster.bus.client import Bus

    v1 = _state(1)
    v1["norm.weight"] = torch.ones(200, dtype=torch.bfloat16)
    v2 = _stepped(v1, 2)
    v2["layer.5.weight"] = v2["layer.5.weight"].reshape(400, 100)  # its bucket cannot be a delta
    enc = codec.DeltaEncoder()
    opened = []
    real_open = wb._open_deltas
    monkeypatch.setattr(wb, "_open_deltas", lambda *a: opened.append(a[1].version) or real_open(*a))
    with Bus(cfg, client_id="delta-test") as bus:
        prod = bus.producer()
        a1 = _publish(cfg, prod, enc, 1, v1)
        a2 = _publish(cfg, prod, enc, 2, v2)
        prod.close()
        assert a1.delta_codec == codec.CODEC and a1.delta_chunks == 0 and a1.delta_base == []
        assert len(a2.buckets) >= 3 and a2.delta_chunks > 0 and a2.delta_uri
        assert a2.delta_base[0] == 1 and a2.delta_base[-1] == -1  # the reshaped tensor's bucket goes whole
        assert wb.wire_ratio(a2) > 1.2

        held = wb.HeldBuckets()
        assert _same(_receive(bus, a1, held), v1) and held.version == 1 and opened == []
        assert held.can_decode(a2)
        assert _same(_receive(bus, a2, held), v2) and held.version == 2 and opened == [2]
        late = wb.HeldBuckets()  # joined after v1: reads v2's full buckets
        assert not late.can_decode(a2)
        assert _same(_receive(bus, a2, late), v2) and late.version == 2 and opened == [2]
        assert _same(_receive(bus, a2, None), v2)  # a receiver that keeps nothing, as before


class _Engine:
    """The engine side of the weight follower without vLLM: keeps what each swap loaded."""

    def __init__(self):
        self.version, self.tensors, self.staged = 0, {}, {}

    async def stage_bucket(self, key: str, i: int, data: bytes) -> None:
        self.staged.setdefault(key, []).append((i, data))

    async def swap_staged(self, key: str, n: int, version: int) -> float:
        got = self.staged.pop(key)
        assert [i for i, _ in got] == list(range(n))
        self.tensors[version] = {name: t for _, data in got for name, t in wb.tensors_of(data)}
        self.version = version
        return 1.0

    async def drop_staged(self, key: str) -> None:
        self.staged.pop(key, None)


def _wait(pred, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_actor_refuses_a_corrupt_delta_keeps_its_version_then_takes_the_next_in_full(make_cfg, tmp_path,
                                                                                      monkeypatch):
    from cluster.bus.client import Bus
    from tests.cluster.follower import follow

    opened = []
    real_open = wb._open_deltas
    monkeypatch.setattr(wb, "_open_deltas", lambda *a: opened.append(a[1].version) or real_open(*a))

    cfg = make_cfg(**{"learner__weight_layout": "buckets", "learner__weight_compression": "xor-delta"})
    engine = _Engine()
    follower, stop = follow(cfg, engine, tmp_path / "w", "actor-delta")
    states = {1: _state(1)}
    for v in (2, 3, 4):
        states[v] = _stepped(states[v - 1], v)
    enc = codec.DeltaEncoder()
    try:
        with Bus(cfg, client_id="learner-delta") as bus:
            prod = bus.producer()
            _publish(cfg, prod, enc, 1, states[1])
            _wait(lambda: engine.version == 1, "v1 applied")
            a2 = _publish(cfg, prod, enc, 2, states[2])
            _wait(lambda: engine.version == 2, "v2 applied from its deltas")
            assert follower.held.version == 2 and a2.delta_chunks > 0
            enc.__class__ = _FlippingEncoder  # v3's delta of bucket 0 is corrupt
            _publish(cfg, prod, enc, 3, states[3])
            enc.__class__ = codec.DeltaEncoder
            _wait(lambda: any("v3" in e for e in follower.errors), "the corrupt v3 refused")
            assert engine.version == 2 and _same(engine.tensors[2], states[2])
            assert "bucket 0 fails its announced blake3 (decoded from its delta)" in follower.errors[-1]
            assert "given up" in follower.errors[-1] and engine.staged == {}
            a4 = _publish(cfg, prod, enc, 4, states[4])  # a delta against v3, which this actor lacks
            assert set(a4.delta_base) == {3} and not follower.held.can_decode(a4)
            _wait(lambda: engine.version == 4, "v4 applied from its full buckets")
            prod.close()
    finally:
        stop()
    assert [a["version"] for a in follower.applied] == [1, 2, 4]
    assert opened == [2, 3]  # v2 and the corrupt v3 from their deltas; v1 and v4 (no base held) in full
    assert _same(engine.tensors[4], states[4]) and follower.held.version == 4
