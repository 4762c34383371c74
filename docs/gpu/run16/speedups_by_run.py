# Median speed-up over eager per example and run (examples told apart by their speed-up pair), calls 1-2 (H200).
# Usage (repository root): python3 docs/gpu/run16/speedups_by_run.py > docs/gpu/run16/speedups_by_run.txt
import re
import statistics

runs = {'call1 warm (5 at once, cold)': 'docs/gpu/run16/call1/eval_worker_warm.log',
        'call1 jobs 4': 'docs/gpu/run16/call1/eval_worker_j4.log', 'call1 jobs 8': 'docs/gpu/run16/call1/eval_worker_j8.log',
        'call2 jobs 4 pool 4': 'docs/gpu/run16/call2/eval_worker_j4.log', 'call2 jobs 6': 'docs/gpu/run16/call2/eval_worker_j6.log'}
keys = [(0.398, 0.397), (0.414, 0.414), (0.90, 1.035), (0.93, 0.928), (25.44, 1.002)]
med = {}
print("# Median speed-up over eager per example and run (examples told apart by their speed-up pair), calls 1-2 (H200)")
for name, f in runs.items():
    xs = [(int(m.group(1)), float(m.group(2)), float(m.group(3))) for m in
          re.finditer(r"reward \+?(-?\d) .*speedup eager ([\d.]+) compile ([\d.]+)", open(f).read())]
    g = {}
    for r, e, c in xs:
        k = min(keys, key=lambda k: abs(e / k[0] - 1) + abs(c / k[1] - 1))
        g.setdefault(k, []).append((r, e))
    row = {k: (len(v), round(statistics.median(e for _, e in v), 4), sorted(set(r for r, _ in v))) for k, v in g.items()}
    med[name] = row
    print(name, [row.get(k) for k in keys])
for k in keys:
    ms = [med[n][k][1] for n in med if k in med[n]]
    print('example', k, 'medians', ms, 'max spread %.2f%%' % (100 * (max(ms) - min(ms)) / statistics.median(ms)))
