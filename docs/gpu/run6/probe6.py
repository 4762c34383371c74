"""Session 6 probe: the timing red-team cases one at a time (no other GPU work), full results as JSON lines."""
import copy, json, sys, tempfile, time
sys.path.insert(0, ".")
from tests.sandbox import cuda_cases
from tests.sandbox.conftest import fast_cfg
from tests.sandbox.helpers import RELU_TASK, shrunk_task
from sandbox_workers.evaluator import Evaluator

out = sys.argv[1]
names = sys.argv[2].split(",")
task = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
cfg = fast_cfg(tempfile.mkdtemp())
cfg.sandbox.eval_timeout_s = 60.0
evs = {"cuda_timing": dict(static_guards=False, compile_baseline=False, baseline_max_cv=0.0),
       "cuda_nostatic": dict(static_guards=False)}
made = {}
def ev(name):
    if name not in made:
        c = copy.deepcopy(cfg)
        for k, v in evs[name].items():
            setattr(c.sandbox, k, v)
        made[name] = Evaluator(c, "cuda")
    return made[name]
cases = {c.name: c for c in cuda_cases.REDTEAM}
for rep in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
    for n in names:
        if n == "honest":
            files, e, mode = cuda_cases.HONEST, "cuda_timing", "both"
        else:
            c = cases[n]; files, e, mode = c.build(None), c.ev, c.mode
        t0 = time.monotonic()
        res = ev(e).evaluate(task, files, mode=mode)
        row = {"case": n, "rep": rep, "s": time.monotonic() - t0, "reward": res["reward"], "correct": res["correct"],
               "violations": res["violations"], "error": res["error"][:600], "speedup": res["speedup_vs_eager"],
               "timings": res.get("timings"), "judged_time_s": res["evidence"].get("judged_time_s"),
               "claimed_time_s": res["evidence"].get("claimed_time_s")}
        print(json.dumps({k: row[k] for k in ("case", "rep", "reward", "violations", "speedup", "judged_time_s")}), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
