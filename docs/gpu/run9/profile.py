"""Where an evaluation's time goes on the GPU: in-process Evaluator, default sandbox config, shipped examples at
KernelBench's own shapes, each evaluated REPS times (the first with a cold baseline cache). One JSON line each."""
import json, os, sys, time, threading, statistics
sys.path.insert(0, ".")
from pathlib import Path
from cluster.config import Config
from sandbox_workers.evaluator import Evaluator
from sandbox_workers.fidelity import solution_files, ROOT

out_path, examples = sys.argv[1], sys.argv[2].split(",")
reps = int(os.environ.get("REPS", "2")); budget = float(os.environ.get("BUDGET_S", "400"))
cache = os.environ.get("CACHE", "/tmp/krl-prof")
cfg = Config(); cfg.broker.cache_dir = cache; cfg.sandbox.backend = "cuda"
cfg.sandbox.artifact_cache_dir = f"{cache}/artifacts"; cfg.sandbox.baseline_cache_dir = f"{cache}/baselines"
for kv in os.environ.get("SETS", "").split():
    k, v = kv.split("="); setattr(cfg.sandbox, k, type(getattr(cfg.sandbox, k))(v) if not isinstance(getattr(cfg.sandbox, k), bool) else v == "true")

samples = []; stop = threading.Event()
def sample():
    import pynvml
    pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
    while not stop.wait(0.2):
        samples.append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
threading.Thread(target=sample, daemon=True).start()
ev = Evaluator(cfg, "cuda"); t_all = time.monotonic(); n = 0
for r in range(reps):
    for name in examples:
        if time.monotonic() - t_all > budget: break
        ex = ROOT / "skills" / "examples" / name
        s0 = len(samples); t0 = time.monotonic()
        res = ev.evaluate((ex / "model.py").read_text(), solution_files(ex), mode="both")
        util = samples[s0:]
        row = {"example": name, "rep": r, "reward": res["reward"], "error": res["error"][:300], "wall_s": time.monotonic() - t0,
               "speedup": res["speedup_vs_eager"], "gpu_util_mean": statistics.fmean(util) if util else None,
               "cand": {k: (res["timings"].get("candidate") or {}).get(k) for k in ("median_s", "n", "batch")},
               "phases": res["evidence"].get("phases")}
        n += 1
        print(json.dumps(row), flush=True)
        with open(out_path, "a") as f: f.write(json.dumps(row) + "\n")
stop.set()
tot = time.monotonic() - t_all
print(json.dumps({"total_s": tot, "evals": n, "evals_per_min": n / tot * 60, "gpu_util_mean": statistics.fmean(samples) if samples else None}), flush=True)
