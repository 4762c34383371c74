"""Where a stress run's device time went: the GPU's busy share at saturation, and inside or outside exclusive holds.

The stress tool (stress.py) knows when each request was sent and answered, and every evaluation's result carries its
device-gate holds (evidence.gate: mode, phase, monotonic grant and release in the worker's process; the worker and
the load generator share the host's monotonic clock when they run on one machine). From those and NVML samples
taken every 0.2 s it reports, over the time the worker had at least as many requests as job slots (saturation):

- the GPU's mean utilisation there (issue 12's "busy at saturation"; the whole run's mean also counts the ramp up
  and the drain of the last replies);
- the share of that time some job held the device exclusively (timing, probe, baselines), per phase;
- the mean utilisation while an exclusive hold was open and while none was, and the gaps between one exclusive
  hold's release and the next one's grant (the device's hand-over), counted and summed by how many jobs were active
  in them where the holds name their job (``job``: a job spans its first request to its last release, so its judge's
  start is not in it: in a gap with none active, every job was starting).

Nothing here is trusted for a reward: it reads results to describe a run.
"""
from __future__ import annotations

import statistics

Interval = tuple[float, float]


def saturated(events: list[tuple[float, int]], slots: int) -> list[Interval]:
    """The intervals during which at least ``slots`` requests were in flight; ``events``: (time, +1 sent / -1
    answered), in any order."""
    out: list[Interval] = []
    level, start = 0, None
    for t, d in sorted(events):
        level += d
        if level >= slots and start is None:
            start = t
        elif level < slots and start is not None:
            if t > start:
                out.append((start, t))
            start = None
    return out


def union(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def overlap(xs: list[Interval], ys: list[Interval]) -> float:
    """Seconds of the union of ``xs`` that lie within the union of ``ys``."""
    total, ys = 0.0, union(ys)
    for a, b in union(xs):
        for c, d in ys:
            total += max(0.0, min(b, d) - max(a, c))
    return total


def inside(t: float, intervals: list[Interval]) -> bool:
    return any(a <= t < b for a, b in intervals)


def report(samples: list[tuple[float, float]], holds: list[dict], events: list[tuple[float, int]], slots: int,
           interval_s: float = 0.2) -> dict:
    """The run's device timeline (see the module's docstring). ``samples``: (monotonic time, utilisation %) from
    NVML, empty without a GPU; ``holds``: gate records with mode, phase, t0, t1."""
    window = saturated(events, max(1, slots))
    span = sum(b - a for a, b in window)
    excl = [(float(h["t0"]), float(h["t1"])) for h in holds
            if h.get("mode") == "exclusive" and isinstance(h.get("t0"), (int, float))
            and isinstance(h.get("t1"), (int, float))]
    out: dict = {"saturated_s": round(span, 3), "saturated_intervals": len(window), "exclusive_holds": len(excl)}
    if span > 0:
        out["exclusive_share"] = round(overlap(excl, window) / span, 4)
        by_phase: dict[str, list[Interval]] = {}
        for h in holds:
            if h.get("mode") == "exclusive" and isinstance(h.get("t1"), (int, float)):
                phase = str(h.get("phase") or "?")  # e.g. "probe", "candidate.timing", "eager.timing"
                by_phase.setdefault(phase, []).append((float(h["t0"]), float(h["t1"])))
        out["exclusive_share_by_phase"] = {p: round(overlap(iv, window) / span, 4) for p, iv in sorted(by_phase.items())}
        spans = handover_spans(excl, window)
        gaps = [b - a for a, b in spans]
        if gaps:
            out["handover_gap_s"] = {"n": len(gaps), "p50": round(statistics.median(gaps), 4),
                                     "mean": round(statistics.fmean(gaps), 4), "sum": round(sum(gaps), 3)}
            by_active = gaps_by_active_jobs(spans, holds)
            if by_active:
                out["handover_gap_s"]["by_active_jobs"] = by_active
    # each NVML reading covers the period before it: a sample belongs where its period's middle lies
    mid = [(t - interval_s / 2, u) for t, u in samples]
    sat = [u for t, u in mid if inside(t, window)]
    if sat:
        ex = union(excl)
        during = [u for t, u in mid if inside(t, window) and inside(t, ex)]
        outside = [u for t, u in mid if inside(t, window) and not inside(t, ex)]
        out["busy_at_saturation"] = round(statistics.fmean(sat) / 100.0, 4)
        out["samples_at_saturation"] = len(sat)
        out["busy_in_exclusive"] = round(statistics.fmean(during) / 100.0, 4) if during else None
        out["busy_outside_exclusive"] = round(statistics.fmean(outside) / 100.0, 4) if outside else None
    return out


def handover_spans(excl: list[Interval], window: list[Interval]) -> list[Interval]:
    """From one exclusive hold's release to the next one's grant, where both lie in the saturated window (a gap
    that spans its edge is the ramp, not a hand-over)."""
    xs = union(excl)
    return [(a1, b0) for (_, a1), (b0, _) in zip(xs, xs[1:]) if any(a <= a1 and b0 <= b for a, b in window)]


def gaps_by_active_jobs(gaps: list[Interval], holds: list[dict]) -> dict[str, dict]:
    """{active jobs at the gap's middle: {n, sum}}; empty when the holds do not name their jobs."""
    spans: dict[object, list[float]] = {}
    for h in holds:
        job, t1 = h.get("job"), h.get("t1")
        start = h.get("t_request", h.get("t0"))
        if job is None or not isinstance(start, (int, float)) or not isinstance(t1, (int, float)):
            continue
        lo_hi = spans.setdefault(job, [float(start), float(t1)])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], float(start)), max(lo_hi[1], float(t1))
    if not spans:
        return {}
    out: dict[str, dict] = {}
    for a, b in gaps:
        mid = (a + b) / 2
        k = str(sum(1 for lo, hi in spans.values() if lo <= mid <= hi))
        row = out.setdefault(k, {"n": 0, "sum": 0.0})
        row["n"] += 1
        row["sum"] = round(row["sum"] + (b - a), 3)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))
