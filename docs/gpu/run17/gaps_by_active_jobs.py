# The hand-over gaps of calls 2 and 4 by how many jobs were active in them (sandbox_workers/stress_timeline.py's
# `by_active_jobs`, which stress runs from session 20 on report themselves): the raw timelines of these calls predate
# the holds' `job` field, so each job's holds are told apart as gap_jobs.py does (a job's holds start with its
# "reference" hold; each reply's holds are contiguous). Usage (repository root, the venv):
# python docs/gpu/run17/gaps_by_active_jobs.py > docs/gpu/run17/gaps_by_active_jobs.txt
import json

from sandbox_workers import stress_timeline as tl

for c in (2, 4):
    d = json.load(open(f"docs/gpu/run17/call{c}/timeline_s1j4.json"))
    job, holds = 0, []
    for h in d["holds"]:
        job += h["phase"] == "reference"
        holds.append(dict(h, job=job))
    r = tl.report([tuple(s) for s in d["samples"]], holds, [tuple(e) for e in d["events"]], slots=4)
    print(f"call{c} jobs 4: busy at saturation {r['busy_at_saturation']}, gaps {r['handover_gap_s']}")
