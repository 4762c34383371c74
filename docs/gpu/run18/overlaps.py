# The gate's safety property on a raw stress timeline: no hold of one job overlaps another job's exclusive hold
# (shared or exclusive; holds name their job, stress.py), and how many other jobs' judges were left running.
# Usage: python3 overlaps.py timeline.json [more.json ...]
import json
import sys

for path in sys.argv[1:]:
    holds = [h for h in json.load(open(path))["holds"] if h.get("t1") is not None]
    if not all("job" in h for h in holds):
        sys.exit(f"{path}: holds without their job (a timeline older than session 20's stress.py)")
    excl = [h for h in holds if h["mode"] == "exclusive"]
    bad = [(e["job"], e["phase"], h["job"], h["phase"], round(min(e["t1"], h["t1"]) - max(e["t0"], h["t0"]), 6))
           for e in excl for h in holds
           if h.get("job") != e.get("job") and h["t0"] < e["t1"] and e["t0"] < h["t1"]]
    frozen = [e["frozen"] for e in excl]
    print(f"{path}: {len(holds)} holds, {len(excl)} exclusive, {len(bad)} overlaps with another job's holds "
          f"{bad[:5]}; processes frozen per exclusive hold: min {min(frozen)}, "
          f"median {sorted(frozen)[len(frozen) // 2]}, max {max(frozen)}")
