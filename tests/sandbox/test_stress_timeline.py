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


def test_handover_gaps_by_the_jobs_active_in_them():
    events = [(0, 1), (0, 1), (20, -1), (20, -1)]  # saturated from 0 to 20
    holds = [  # job 1: 0-8, timed 2-3 and 6-7; job 2: 3.5-12, timed 9-10; job 3: 13-19, timed 15-16
        {"job": 1, "mode": "shared", "phase": "reference", "t_request": 0.0, "t0": 0.0, "t1": 1.0},
        {"job": 1, "mode": "exclusive", "phase": "probe", "t_request": 1.0, "t0": 2.0, "t1": 3.0},
        {"job": 1, "mode": "exclusive", "phase": "candidate.timing", "t_request": 5.0, "t0": 6.0, "t1": 7.0},
        {"job": 1, "mode": "shared", "phase": "x", "t_request": 7.0, "t0": 7.0, "t1": 8.0},
        {"job": 2, "mode": "shared", "phase": "reference", "t_request": 3.5, "t0": 3.5, "t1": 4.0},
        {"job": 2, "mode": "exclusive", "phase": "candidate.timing", "t_request": 8.5, "t0": 9.0, "t1": 10.0},
        {"job": 2, "mode": "shared", "phase": "x", "t_request": 11.0, "t0": 11.0, "t1": 12.0},
        {"job": 3, "mode": "shared", "phase": "reference", "t_request": 13.0, "t0": 13.0, "t1": 14.0},
        {"job": 3, "mode": "exclusive", "phase": "candidate.timing", "t_request": 14.0, "t0": 15.0, "t1": 16.0},
        {"job": 3, "mode": "shared", "phase": "x", "t_request": 18.0, "t0": 18.0, "t1": 19.0}]
    r = tl.report([], holds, events, slots=2)
    # gaps 3-6 (middle 4.5: jobs 1 and 2), 7-9 (8: jobs 1 and 2), 10-15 (12.5: neither, job 2 ended at 12)
    assert r["handover_gap_s"]["n"] == 3 and r["handover_gap_s"]["sum"] == 10.0
    assert r["handover_gap_s"]["by_active_jobs"] == {"0": {"n": 1, "sum": 5.0}, "2": {"n": 2, "sum": 5.0}}
    untagged = [{k: v for k, v in h.items() if k != "job"} for h in holds]
    assert "by_active_jobs" not in tl.report([], untagged, events, slots=2)["handover_gap_s"]


def test_no_gpu_no_samples_no_busy_figures():
    r = tl.report([], [{"mode": "exclusive", "phase": "probe", "t0": 0.0, "t1": 1.0}], [(0, 1), (4, -1)], slots=1)
    assert r["exclusive_share"] == 0.25 and "busy_at_saturation" not in r
    assert tl.report([], [], [], slots=1) == {"saturated_s": 0, "saturated_intervals": 0, "exclusive_holds": 0}
