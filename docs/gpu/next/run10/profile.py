"""Several evaluation jobs per GPU (sandbox.jobs_per_device): the in-process Evaluator over shipped examples at
KernelBench's own shapes, first one job at a time, then JOBS at once (threads submitting evaluations), NVML sampled
every 0.2 s. Prints (and writes under the output folder) evaluations/min, p50 latency per phase, the GPU's busy
fraction, and whether the rewards and speed-ups of the runs agree.

usage: python3 profile.py OUT_DIR EXAMPLES   (env: BACKEND=cuda|cpu, JOBS=1,4, REPS=3, WARM_S, RUN_S, RECHECK_S,
       PREWARM_S, CACHE, SETS="field=value ...", BASE_RECHECK=1)"""
import json
import os
import statistics
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, ".")
from cluster.config import Config
from sandbox_workers.evaluator import Evaluator
from sandbox_workers.fidelity import ROOT, solution_files
from sandbox_workers.stress import flat_phases

out_dir, examples = sys.argv[1], [e for e in sys.argv[2].split(",") if e]
backend = os.environ.get("BACKEND", "cuda")
jobs_list = [int(j) for j in os.environ.get("JOBS", "1,4").split(",")]
reps = int(os.environ.get("REPS", "3"))
warm_s = float(os.environ.get("WARM_S", "170"))  # the cold pass (baselines measured, not counted)
run_s = float(os.environ.get("RUN_S", "80"))  # each measured run (no new job starts after it)
recheck_s = float(os.environ.get("RECHECK_S", "40"))  # baselines measured again under concurrency
prewarm_s = float(os.environ.get("PREWARM_S", "12"))  # the warm pool fills before each run's clock
cache = os.environ.get("CACHE", "/tmp/krl-prof10")
os.makedirs(out_dir, exist_ok=True)
rec_path = os.path.join(out_dir, "run10_profile.jsonl")
T0 = time.monotonic()


def emit(row: dict) -> None:
    line = json.dumps(row, default=str)
    print(line[:2000], flush=True)
    with open(rec_path, "a") as f:
        f.write(line + "\n")


def make_cfg(jobs: int) -> Config:
    cfg = Config()
    cfg.broker.cache_dir = cache
    cfg.sandbox.backend = backend
    cfg.sandbox.artifact_cache_dir = f"{cache}/artifacts"
    cfg.sandbox.baseline_cache_dir = f"{cache}/baselines"
    if backend == "cpu":  # a dry run on a small host: small shapes would be the caller's business; keep it short
        cfg.sandbox.timing_budget_s = 0.3
        cfg.sandbox.trials = 5
        cfg.sandbox.compile_baseline = os.environ.get("COMPILE_BASELINE", "0") == "1"
    for kv in os.environ.get("SETS", "").split():
        k, v = kv.split("=", 1)
        cur = getattr(cfg.sandbox, k)
        setattr(cfg.sandbox, k, (v == "true") if isinstance(cur, bool) else type(cur)(v))
    cfg.sandbox.jobs_per_device = jobs
    return cfg


class Sampler:
    """NVML utilisation every 0.2 s (GPU 0 or the pinned one), from start() to stop()."""

    def __init__(self):
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self.error = ""
        self._t = threading.Thread(target=self._run, daemon=True)
        if backend == "cuda":
            self._t.start()

    def _run(self):
        try:
            import pynvml
            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            while not self._stop.wait(0.2):
                self.samples.append((time.monotonic(), pynvml.nvmlDeviceGetUtilizationRates(h).gpu))
        except Exception as exc:  # noqa: BLE001
            self.error = f"{type(exc).__name__}: {exc}"

    def window(self, t0: float, t1: float) -> dict:
        xs = [u for t, u in self.samples if t0 <= t <= t1]
        if not xs:
            return {"gpu_n": 0, "gpu_error": self.error}
        return {"gpu_n": len(xs), "gpu_busy_fraction": round(statistics.fmean(xs) / 100, 4),
                "gpu_nonidle_fraction": round(sum(x > 0 for x in xs) / len(xs), 4),
                "gpu_util_p50": statistics.median(xs)}

    def stop(self):
        self._stop.set()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else None


def one(ev, name: str, run: str, jobs: int, deadline: float, sampler: Sampler) -> dict | None:
    if time.monotonic() > deadline:
        return None
    ex = ROOT / "skills" / "examples" / name
    t0 = time.monotonic()
    try:
        res = ev.evaluate((ex / "model.py").read_text(), solution_files(ex), mode="both")
    except Exception:  # noqa: BLE001
        row = {"run": run, "jobs": jobs, "example": name, "crash": traceback.format_exc()[-2000:]}
        emit(row)
        return row
    t1 = time.monotonic()
    evid = res.get("evidence") or {}
    gate = evid.get("gate") or []
    cand = (res.get("timings") or {}).get("candidate") or {}
    row = {"run": run, "jobs": jobs, "example": name, "reward": res["reward"], "correct": res["correct"],
           "error": (res.get("error") or "")[:300], "t0": round(t0 - T0, 3), "wall_s": round(t1 - t0, 4),
           "speedup_eager": res["speedup_vs_eager"], "speedup_compile": res["speedup_vs_compile"],
           "cand_median_s": cand.get("median_s"), "batch": cand.get("batch"), "n": cand.get("n"),
           "eager_median_s": ((res.get("timings") or {}).get("eager") or {}).get("median_s"),
           "baseline_cached": evid.get("baseline_cached"), "timing_noisy": bool(evid.get("timing_noisy")),
           "arena": evid.get("arena"), "phases": flat_phases(evid.get("phases") or {}),
           "gate": [{k: h.get(k) for k in ("role", "mode", "phase", "waited_s", "frozen", "idle", "idle_wait_s",
                                           "util_pct")} | {"held_s": round((h.get("t1") or t1) - h["t0"], 4)}
                    for h in gate],
           **sampler.window(t0, t1)}
    emit(row)
    return row


def run_pass(run: str, jobs: int, budget: float, sampler: Sampler, recheck: bool = False) -> dict:
    cfg = make_cfg(jobs)
    ev = Evaluator(cfg, backend)
    try:
        if prewarm_s > 0 and cfg.sandbox.warm_sessions:  # fill the warm pool before the clock (start-up is not the point)
            ev._take("candidate").close()
            time.sleep(prewarm_s)
        order = [name for _ in range(reps) for name in examples]
        t_start = time.monotonic()
        deadline = t_start + budget
        rows = []
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = [pool.submit(one, ev, name, run, jobs, deadline, sampler) for name in order]
            if recheck:  # the baselines measured again (no cache) while the candidates run: timing under load
                tasks = {name: (ROOT / "skills" / "examples" / name / "model.py").read_text() for name in examples}
                futs += [pool.submit(recheck_one, ev, name, src, deadline + recheck_s) for name, src in tasks.items()]
            for f in futs:
                r = f.result()
                if r:
                    rows.append(r)
        t_end = time.monotonic()
    finally:
        ev.close()
    evals = [r for r in rows if "reward" in r]
    wall = t_end - t_start
    phases: dict[str, list] = {}
    for r in evals:
        for k, v in r["phases"].items():
            phases.setdefault(k, []).append(v)
    summary = {"summary": run, "jobs": jobs, "evals": len(evals), "crashes": sum("crash" in r for r in rows),
               "wall_s": round(wall, 3), "evals_per_min": round(len(evals) / wall * 60, 3) if wall else None,
               "latency_p50_s": pct([r["wall_s"] for r in evals], 0.5),
               "latency_p90_s": pct([r["wall_s"] for r in evals], 0.9),
               "phase_p50_s": {k: round(pct(v, 0.5), 4) for k, v in sorted(phases.items())},
               "timing_noisy": sum(r["timing_noisy"] for r in evals),
               "gate_wait_p50_s": pct([r["phases"].get("gate_wait_s", 0.0) for r in evals], 0.5),
               # NVML's utilisation when an exclusive section was granted (others frozen): > 0 is the previous
               # sample period's work (or kernels a frozen process had queued); idle False: gate_idle_wait_s ran out
               "excl_grants": sum(h["mode"] == "exclusive" for r in evals for h in r["gate"]),
               "excl_util_at_grant": [h.get("util_pct") for r in evals for h in r["gate"]
                                      if h["mode"] == "exclusive" and h.get("util_pct") is not None][:200],
               "excl_not_idle": sum(h.get("idle") is False for r in evals for h in r["gate"]),
               "baseline_rechecks": [r for r in rows if "recheck" in r],
               **sampler.window(t_start, t_end)}
    emit(summary)
    return {"summary": summary, "rows": evals}


def recheck_one(ev, name: str, src: str, deadline: float) -> dict | None:
    if time.monotonic() > deadline:
        return None
    t0 = time.monotonic()
    try:
        cached = ev.baselines(src)
        fresh = ev.baselines(src, use_cache=False)
    except Exception as exc:  # noqa: BLE001
        return {"recheck": name, "error": f"{type(exc).__name__}: {exc}"[:500]}
    row = {"recheck": name, "wall_s": round(time.monotonic() - t0, 3)}
    for v in ("eager", "compile"):
        a, b = (cached.get(v) or {}).get("median_s"), (fresh.get(v) or {}).get("median_s")
        row[v] = {"cached_s": a, "fresh_s": b, "ratio": round(b / a, 4) if a and b else None}
    row["gate_noisy"] = fresh.get("gate_noisy")
    emit(row)
    return row


def compare(a: dict, b: dict) -> dict:
    """Per example: rewards (every one) and the median speed-up vs eager of each run, and their ratio."""
    out = {}
    for name in examples:
        ra = [r for r in a["rows"] if r["example"] == name]
        rb = [r for r in b["rows"] if r["example"] == name]
        if not ra or not rb:
            continue
        sa = statistics.median(r["speedup_eager"] for r in ra)
        sb = statistics.median(r["speedup_eager"] for r in rb)
        ca = statistics.median(r["cand_median_s"] or 0 for r in ra)
        cb = statistics.median(r["cand_median_s"] or 0 for r in rb)
        out[name] = {"rewards": [sorted({r["reward"] for r in ra}), sorted({r["reward"] for r in rb})],
                     "rewards_same": {r["reward"] for r in ra} == {r["reward"] for r in rb},
                     "speedup_eager": [round(sa, 4), round(sb, 4)], "speedup_ratio": round(sb / sa, 4) if sa else None,
                     "cand_median_ratio": round(cb / ca, 4) if ca else None}
    ratios = [v["speedup_ratio"] for v in out.values() if v["speedup_ratio"]]
    return {"per_example": out, "all_rewards_same": all(v["rewards_same"] for v in out.values()),
            "max_speedup_dev": round(max(abs(r - 1) for r in ratios), 4) if ratios else None}


def main() -> int:
    sampler = Sampler()
    emit({"start": time.time(), "backend": backend, "examples": examples, "jobs": jobs_list, "reps": reps,
          "sets": os.environ.get("SETS", ""), "cpus": os.cpu_count()})
    if warm_s > 0:  # cold pass: artifacts built, baselines measured and cached (not counted)
        t0 = time.monotonic()
        ev = Evaluator(make_cfg(1), backend)
        try:
            for name in examples:
                one(ev, name, "cold", 1, t0 + warm_s, sampler)
        finally:
            ev.close()
    results = {}
    for _i, jobs in enumerate(jobs_list):
        recheck = os.environ.get("BASE_RECHECK", "1") == "1" and jobs > 1
        results[jobs] = run_pass(f"jobs{jobs}", jobs, run_s, sampler, recheck=recheck)
    sampler.stop()
    final = {"final": True, "total_s": round(time.monotonic() - T0, 1),
             "runs": {j: r["summary"] | {"baseline_rechecks": len(r["summary"]["baseline_rechecks"])}
                      for j, r in results.items()}}
    if len(jobs_list) >= 2:
        final["compare"] = compare(results[jobs_list[0]], results[jobs_list[-1]])
    emit(final)
    with open(os.path.join(out_dir, "run10_summary.json"), "w") as f:
        json.dump(final, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
