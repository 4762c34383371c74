"""The stress run's device timeline (sandbox_workers/stress_timeline.py) on a hand-made run whose answer is known."""
from sandbox_workers import stress_timeline as tl


def test_saturation_is_when_the_slots_were_all_asked_for():
    # two slots; requests sent at 0, 1, 2 and answered at 5, 6, 9: two or more in flight from 1 to 6
    events = [(0, 1), (1, 1), (2, 1), (5, -1), (6, -1), (9, -1)]
    assert tl.saturated(events, 2) == [(1, 6)]
    assert tl.saturated(events, 1) == [(0, 9)]
    assert tl.saturated(events, 4) == []


def test_exclusive_share_busy_inside_and_outside_and_the_handovers():
    events = [(0, 1), (0, 1), (10, -1), (10, -1)]  # saturated from 0 to 10 with 2 slots
    holds = [{"mode": "exclusive", "phase": "probe", "t0": 1.0, "t1": 2.0},
             {"mode": "exclusive", "phase": "candidate.timing", "t0": 2.5, "t1": 6.5},
             {"mode": "shared", "phase": "reference", "t0": 0.0, "t1": 9.0},
             {"mode": "exclusive", "phase": "candidate.timing", "t0": 12.0, "t1": 13.0}]  # after the window
    # one sample a second at the end of its period: busy 100 % inside the exclusive holds, 20 % elsewhere
    samples = [(t + 0.1, 100.0 if 1 <= t < 2 or 2.5 <= t < 6.5 else 20.0) for t in [x * 0.2 for x in range(50)]]
    r = tl.report(samples, holds, events, slots=2)
    assert r["saturated_s"] == 10 and r["exclusive_holds"] == 3
    assert r["exclusive_share"] == 0.5  # 1 s + 4 s of 10
    assert r["exclusive_share_by_phase"] == {"candidate.timing": 0.4, "probe": 0.1}
    assert r["handover_gap_s"]["n"] == 1 and abs(r["handover_gap_s"]["p50"] - 0.5) < 1e-9
    assert r["busy_in_exclusive"] == 1.0 and r["busy_outside_exclusive"] == 0.2
    assert abs(r["busy_at_saturation"] - 0.6) < 1e-9 and r["samples_at_saturation"] == 50


def test_no_gpu_no_samples_no_busy_figures():
    r = tl.report([], [{"mode": "exclusive", "phase": "probe", "t0": 0.0, "t1": 1.0}], [(0, 1), (4, -1)], slots=1)
    assert r["exclusive_share"] == 0.25 and "busy_at_saturation" not in r
    assert tl.report([], [], [], slots=1) == {"saturated_s": 0, "saturated_intervals": 0, "exclusive_holds": 0}
