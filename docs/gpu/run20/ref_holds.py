"""Per raw stress timeline: the judge's first shared hold ("reference": the reference placed, the spikes planned,
the device arena mapped) per job, and the saturated time split by whether an exclusive request was waiting.

    python3 docs/gpu/run20/ref_holds.py docs/gpu/run20/call1/logs/timeline_s1j4.json ...
"""
from __future__ import annotations

import json
import statistics
import sys


def report(path: str) -> str:
    holds = json.load(open(path))["holds"]  # noqa: SIM115 - read once
    ref = [h["t1"] - h["t0"] for h in holds if h["phase"] == "reference"]
    ex = [h for h in holds if h["mode"] == "exclusive"]
    lo, hi = min(h["t0"] for h in holds) + 20, max(h["t1"] for h in holds) - 20  # the ramps left out, as util_by_phase
    split = {"exclusive": 0.0, "exclusive waiting": 0.0, "none waiting": 0.0}
    t, dt = lo, 0.01
    while t < hi:
        if any(e["t0"] <= t < e["t1"] for e in ex):
            split["exclusive"] += dt
        elif any(e["t_request"] <= t < e["t0"] for e in ex):
            split["exclusive waiting"] += dt
        else:
            split["none waiting"] += dt
        t += dt
    return (f"{path}: reference holds {len(ref)}, p50 {statistics.median(ref):.3f} s, mean {statistics.mean(ref):.3f} s,"
            f" sum {sum(ref):.1f} s; {hi - lo:.1f} s without the first and last 20 s: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in split.items()))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(report(p))
