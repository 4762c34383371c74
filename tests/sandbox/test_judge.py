"""The judge's wire: what it accepts from the remote, sealing, the claim bound and the judged time."""
from __future__ import annotations

import os
import struct

import pytest
import torch

from sandbox_workers.candidate import wire


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
                                   torch.int32, torch.uint8, torch.bool])
def test_sealing_hides_the_values_and_unseals_exactly(dtype):
    x = (torch.randn(4096) * 100).to(dtype)
    y = x.clone()
    wire.seal([y, 3], key=12345)
    if dtype != torch.bool:  # a bool pad is one bit: still random, but may leave some equal
        assert (y != x).float().mean() > 0.9
    wire.seal([y, 3], key=12345)
    assert torch.equal(x, y)
    z = x.clone()
    wire.seal([z], key=12345)
    wire.seal([z], key=12346)  # the wrong key does not unseal
    assert dtype == torch.bool or not torch.equal(x, z)


def _arena(tmp_path, size=1 << 16):
    return wire.Arena(str(tmp_path / "arena"), size=size)


def test_arena_round_trip_and_descriptor_validation(tmp_path):
    a = _arena(tmp_path)
    t = torch.randn(3, 5)
    descs, end = a.put([t, 7, [1, 2]], 0, 4096)
    assert torch.equal(a.get(descs[0], 0, 4096), t) and a.get(descs[1]) == 7 and a.get(descs[2]) == [1, 2]
    good = descs[0]
    bad = [dict(good, off=good["off"] + 8192),  # outside its region
           dict(good, dtype="object"),  # unknown dtype
           dict(good, shape=[3, 6]),  # size does not match the bytes
           dict(good, off=good["off"] + 4),  # misaligned
           dict(good, shape=[-1, 15]), dict(good, off="0"), "not a dict", {"t": "pointer"}]
    for d in bad:
        with pytest.raises(wire.ProtocolError):
            a.get(d, 0, 4096)
    with pytest.raises(wire.ProtocolError, match="more than"):
        a.put([torch.zeros(2048)], 0, 4096)  # 8 KiB into a 4 KiB region
    a.ensure(1 << 20)
    assert a.size == 1 << 20
    a.close()


def test_channel_rejects_oversized_garbage_and_times_out():
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    ch = wire.Channel(r1, w2)
    peer = wire.Channel(r2, w1)
    peer.send({"op": "x", "v": [1, 2]})
    assert ch.recv(timeout=5) == {"op": "x", "v": [1, 2]}
    os.write(w1, struct.pack(">I", wire.MAX_MESSAGE + 1))
    with pytest.raises(wire.ProtocolError, match="exceeds"):
        ch.recv(timeout=5)
    os.write(w1, struct.pack(">I", 3) + b"[1]")
    with pytest.raises(wire.ProtocolError, match="not an object"):
        ch.recv(timeout=5)
    with pytest.raises(wire.PeerTimeout):
        ch.recv(timeout=0.2)
    os.close(w1)
    with pytest.raises(wire.PeerGone):
        ch.recv(timeout=5)
    for fd in (r1, r2, w2):
        os.close(fd)


def test_claim_bound():
    from sandbox_workers.evaluator import claim_contradicted

    base = {"batch": 4, "median_s": 1e-4, "trusted": {"run_gap_s": 0.001, "run_s": 0.0014}}
    honest = {"batch": 4, "median_s": 5e-5, "trusted": {"run_gap_s": 0.0011, "run_s": 0.0013}}
    assert claim_contradicted(honest, base, 0.25, 0.0005) == ""
    # the same wall, a claim ten times too small: the work it hides is left unclaimed
    forged = {"batch": 4, "median_s": 5e-6, "trusted": {"run_gap_s": 0.0013 - 2e-5, "run_s": 0.0013}}
    assert "contradicted" in claim_contradicted(dict(forged, trusted=dict(forged["trusted"], run_gap_s=0.0025)),
                                                base, 0.25, 0.0005)
    # twice the batch: twice the unsealing and output copies are allowed
    assert claim_contradicted(dict(honest, batch=8, trusted={"run_gap_s": 0.0021, "run_s": 0.003}), base,
                              0.25, 0.0005) == ""
    assert claim_contradicted({"batch": 1}, base, 0.25, 0.0005) == ""  # nothing measured: nothing to say


def test_judged_time_is_the_run_wall_less_the_reference_overhead():
    from sandbox_workers.evaluator import judged_time

    base = {"batch": 2, "trusted": {"run_gap_s": 0.002, "run_s": 0.004}}
    # a claim of 1 us per call over a 12 ms run of 4 calls: the judge counts (12 - 2 * 2) / 4 = 2 ms
    assert abs(judged_time({"batch": 4, "median_s": 1e-6, "trusted": {"run_s": 0.012, "run_gap_s": 0.012}}, base)
               - 0.002) < 1e-12
    assert judged_time({"batch": 1, "trusted": {"run_s": 0.001, "run_gap_s": 0.001}}, base) == 0.0  # never negative
    assert judged_time({"batch": 1}, base) == 0.0


def test_the_candidates_own_probe_bounds_its_claims_before_the_baseline():
    from sandbox_workers.evaluator import claim_contradicted, judged_time

    # the baseline's session had a large overhead (another session: noise); the candidate's own probe, taken in
    # its session before its code was loaded, had a small one. A forged claim that fits the baseline's overhead
    # is contradicted by the probe, and the judged time counts the hidden work. With the probe, the least of the
    # trials is compared with the least of the probe's (interference only adds time).
    base = {"batch": 4, "trusted": {"run_gap_s": 0.004, "run_s": 0.005}}
    probe = {"run_gap_s": 0.0009, "run_gap_min_s": 0.0005, "batch": 4, "trials": 7}
    trusted = {"run_gap_s": 0.0040, "run_s": 0.0040, "run_gap_min_s": 0.0036, "run_min_s": 0.0036}
    forged = {"batch": 4, "median_s": 1e-6, "trusted": dict(trusted, probe=probe)}
    unprobed = dict(forged, trusted=trusted)
    assert claim_contradicted(unprobed, base, 0.25, 0.0005) == ""
    assert "doing nothing" in claim_contradicted(forged, base, 0.25, 0.0005)
    assert abs(judged_time(forged, base) - (0.0036 - 0.0005) / 4) < 1e-12
    assert judged_time(unprobed, base) == 0.0  # the old hole: the baseline's overhead swallows the work
    # a probe taken with another batch is not comparable: the baseline's overhead is used
    other = dict(forged, trusted=dict(trusted, probe=dict(probe, batch=8)))
    assert claim_contradicted(other, base, 0.25, 0.0005) == ""
    honest = {"batch": 4, "median_s": 7e-4, "trusted": {"run_gap_s": 0.0009, "run_s": 0.0037, "run_gap_min_s": 0.0005,
                                                      "run_min_s": 0.0033, "probe": probe}}
    assert claim_contradicted(honest, base, 0.25, 0.0005) == ""
    assert abs(judged_time(honest, base) - 7e-4) < 1e-12  # an honest claim is what the judge's clock says
    # claims forged in every trial but one: that trial's own gap is small, but the claim the reward uses (the
    # median) leaves the least round trip mostly unclaimed
    mixed = dict(honest, median_s=1e-6, trusted=dict(honest["trusted"], run_gap_min_s=0.0005))
    assert "contradicted" in claim_contradicted(mixed, base, 0.25, 0.0005)


def test_a_probe_slowed_by_interference_never_lets_a_forged_clock_stand():
    from sandbox_workers.evaluator import PROBE_OVER_REFERENCE_MAX, claim_contradicted, judged_time

    # CI, held-out red team: 8 calls of a ~1 ms kernel claimed at 1/100 of their time; the probe ran beside a burst
    # of load and its least round trip of 8 echo calls took as long as the kernel's (8 ms): the judged time was ~0,
    # the forged claim stood, reward 3. The reference's own trials (another session, the same protocol and batch)
    # left 0.2 ms unclaimed: the probe is believed up to PROBE_OVER_REFERENCE_MAX times that.
    base = {"batch": 8, "median_s": 3e-5, "trusted": {"run_gap_s": 0.0003, "run_gap_min_s": 0.0002, "run_s": 0.0005}}
    probe = {"run_gap_s": 0.0085, "run_gap_min_s": 0.0080, "batch": 8, "trials": 7}
    forged = {"batch": 8, "median_s": 1e-5, "trusted": {"run_gap_s": 0.0082, "run_s": 0.0083, "run_gap_min_s": 0.0080,
                                                       "run_min_s": 0.0081, "probe": probe}}
    est = judged_time(forged, base)
    assert abs(est - (0.0081 - PROBE_OVER_REFERENCE_MAX * 0.0002) / 8) < 1e-12
    assert est > 0.9e-3  # the work is counted: about 1 ms a call, not the claimed 10 us
    # a probe within the bound is believed as measured (an honest claim stands: the earlier tests)
    calm = dict(forged, trusted=dict(forged["trusted"], probe=dict(probe, run_gap_min_s=0.0003)))
    assert abs(judged_time(calm, base) - (0.0081 - 0.0003) / 8) < 1e-12
    # the claim bound believes the probe as far on CPU (CI: a slowed probe let a 1/100 claim go unflagged there)
    assert claim_contradicted(forged, base, 2.0, 0.0, cap_probe=True)
    assert not claim_contradicted(forged, base, 2.0, 0.0)  # the probe as measured hid 1/100 of the work
    honest = dict(forged, median_s=1e-3)  # the same round trip, claimed as what it was: ~1 ms a call
    assert not claim_contradicted(honest, base, 2.0, 0.0, cap_probe=True)
