# Median speed-up over eager per example and run (H100, calls 2 and 4; examples told apart by clustering their
# speed-up over eager within 2 %). Usage (repository root): python3 docs/gpu/run17/speedups_by_run.py
# [label=eval_worker.log ...] (other runs' logs: session 21's docs/gpu/run18/speedups_by_run.txt)
import re
import statistics
import sys

runs = {"call2 warm (5 at once, cold)": "docs/gpu/run17/call2/eval_worker_warm.log",
        "call2 jobs 4 (old budget)": "docs/gpu/run17/call2/eval_worker_s1j4.log",
        "call2 jobs 8 (old budget)": "docs/gpu/run17/call2/eval_worker_s2j8.log",
        "call4 warm (5 at once, cold)": "docs/gpu/run17/call4/eval_worker_warm.log",
        "call4 jobs 4 (new budget)": "docs/gpu/run17/call4/eval_worker_s1j4.log",
        "call4 jobs 6 (new budget, cut off)": "docs/gpu/run17/call4/eval_worker_s2j6.log"}
if sys.argv[1:]:
    runs = dict(a.split("=", 1) for a in sys.argv[1:])
pat = re.compile(r"reward \+?(-?\d) .*speedup eager ([\d.]+) compile ([\d.]+)")
per_run = {n: [(int(m.group(1)), float(m.group(2))) for m in pat.finditer(open(f).read())] for n, f in runs.items()}
centres: list[float] = []
for e in sorted(e for xs in per_run.values() for _, e in xs):
    if not centres or e > centres[-1] * 1.02:
        centres.append(e)
key = lambda e: min(centres, key=lambda c: abs(e / c - 1))  # noqa: E731
meds: dict[float, list[float]] = {}
for name, xs in per_run.items():
    g: dict[float, list] = {}
    for r, e in xs:
        g.setdefault(key(e), []).append((r, e))
    row = []
    for c in sorted(g):
        m = statistics.median(e for _, e in g[c])
        meds.setdefault(c, []).append(m)
        row.append((len(g[c]), round(m, 4), sorted({r for r, _ in g[c]})))
    print(name, row)
for c, ms in sorted(meds.items()):
    print(f"example ~{c:.3f}: medians {[round(m, 4) for m in ms]} max spread {100 * (max(ms) / min(ms) - 1):.2f}%")
