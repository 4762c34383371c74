"""The GPU's NVML utilisation by what the gate held at each sample: a stress run's raw timeline (`--raw-timeline`),
every 0.2 s sample between the first and last hold put under the exclusive hold's phase, or the set of shared
phases held then ("none": no hold). NVML averages over its own sampling window, so a reading lags its phase a little.
Usage: python3 docs/gpu/run19/util_by_phase.py TIMELINE.json [...]"""
import collections
import json
import sys


def by_phase(path: str) -> list[tuple[str, float, float]]:
    d = json.load(open(path))
    holds, samples = d["holds"], d["samples"]
    lo, hi = min(h["t0"] for h in holds), max(h["t1"] for h in holds)
    acc = collections.defaultdict(lambda: [0, 0.0])
    for t, util in samples:
        if not lo <= t <= hi:
            continue
        held = [h for h in holds if h["t0"] <= t <= h["t1"]]
        excl = [h["phase"] for h in held if h["mode"] == "exclusive"]
        key = "EXCL " + excl[0] if excl else "shared: " + ("+".join(sorted({h["phase"] for h in held})) or "none")
        acc[key][0] += 1
        acc[key][1] += util
    n = sum(v[0] for v in acc.values())
    return sorted(((k, c / n, u / c) for k, (c, u) in acc.items()), key=lambda r: -r[1])


if __name__ == "__main__":
    for path in sys.argv[1:]:
        print(path)
        for key, share, util in by_phase(path)[:8]:
            print(f"  {share:5.3f} of the time, NVML util {util:5.1f}%  {key}")
