"""Session 6: a forged time claim (torch.cuda.Event replaced, the honest ReLU kernel) at a large output,
default sandbox config (static guards off: they are a speed bump, not the trust boundary)."""
import json, sys, tempfile, time
sys.path.insert(0, ".")
from cluster.config import Config
from sandbox_workers.evaluator import Evaluator
from tests.sandbox import cuda_cases
from tests.sandbox.helpers import RELU_TASK, shrunk_task

out, dims = sys.argv[1], [int(d) for d in sys.argv[2].split(",")]
d = tempfile.mkdtemp()
cfg = Config()
cfg.broker.cache_dir = d
cfg.sandbox.backend = "cuda"
cfg.sandbox.compile_baseline = False
cfg.sandbox.static_guards = False
cfg.sandbox.artifact_cache_dir, cfg.sandbox.baseline_cache_dir = f"{d}/a", f"{d}/b"
ev = Evaluator(cfg, "cuda")
forged = cuda_cases.cuda_forward(cuda_cases.CALL, header=cuda_cases._FAKE_EVENT, kernel=cuda_cases.HONEST)
for dim in dims:
    task = shrunk_task(RELU_TASK[0], batch_size=4096, dim=dim)
    for name, files in (("honest", cuda_cases.HONEST), ("forged_event", forged)):
        t0 = time.monotonic()
        res = ev.evaluate(task, files, mode="both")
        tm = res.get("timings") or {}
        row = {"case": name, "shape": [4096, dim], "s": round(time.monotonic() - t0, 1), "reward": res["reward"],
               "violations": res["violations"], "error": res["error"][:400], "speedup": res["speedup_vs_eager"],
               "judged_time_s": res["evidence"].get("judged_time_s"), "claimed_time_s": res["evidence"].get("claimed_time_s"),
               "candidate": {k: v for k, v in (tm.get("candidate") or {}).items() if k in ("median_s", "cv", "n", "batch", "trusted")},
               "eager": {k: v for k, v in (tm.get("eager") or {}).items() if k in ("median_s", "cv", "n", "batch", "trusted")}}
        print(json.dumps({k: row[k] for k in ("case", "shape", "s", "reward", "violations", "speedup", "judged_time_s")}), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
