"""Timing fidelity: the judged oracle's speed-ups against an independent KernelBench-style harness.

`python -m sandbox_workers.fidelity --examples cuda_23_softmax,... [--out results.jsonl]` on a GPU
machine. For each shipped example (skills/examples/<name>: model.py, model_new.py, kernels/) it
1. evaluates the solution with the oracle (`Evaluator.evaluate`, mode both, the judged protocol);
2. times the same eager Model and the same built ModelNew in one trusted process the way
   KernelBench does: inputs from get_inputs() on the GPU, 256 MB L2 flush before every trial,
   CUDA events around one call, median of >= 100 trials after warm-up;
and prints one JSON line per example with both speed-ups and their ratio. The oracle's protocol
differs (fresh sealed inputs per call, a judge in another process): the ratio says how much.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import types
from pathlib import Path

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]


def kernelbench_time(fn, inputs, trials: int, warmup: int = 10) -> float:
    """Median seconds of fn(*inputs): flush L2 (256 MB zeroed), events around one call."""
    import torch

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    with torch.no_grad():
        for _ in range(warmup):
            fn(*inputs)
        torch.cuda.synchronize()
        times = []
        for _ in range(trials):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(times)


def harness(example: Path, cfg, trials: int) -> dict:
    """Eager and candidate times in this (trusted) process, for honest shipped solutions only."""
    import torch

    from sandbox_workers import compiler
    from sandbox_workers.runner_common import load_task, seed_all

    files = solution_files(example)
    out = compiler.compile_workspace(files, "cuda", cfg)
    if not out.ok:
        raise RuntimeError(f"{example.name}: build failed: {out.error}\n{out.log}")
    sys.path.insert(0, str(ROOT / "skills" / "infra"))
    import krl

    krl._bind(str(out.library), "cuda")
    task = load_task((example / "model.py").read_text())
    seed_all(0)
    init = list(task.get_init_inputs())
    seed_all(0)
    model = task.Model(*init).cuda().eval()
    mod = types.ModuleType("model_new")
    exec(compile(files["model_new.py"], "model_new.py", "exec"), mod.__dict__)  # noqa: S102 - shipped example
    new = mod.ModelNew(*init).cuda().eval()
    new.load_state_dict(model.state_dict(), strict=False)
    seed_all(1)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    t_eager = kernelbench_time(model, inputs, trials)
    t_new = kernelbench_time(new, inputs, trials)
    return {"eager_s": t_eager, "candidate_s": t_new, "speedup": t_eager / t_new, "trials": trials}


def solution_files(example: Path) -> dict[str, str]:
    files = {"model_new.py": (example / "model_new.py").read_text()}
    for k in sorted((example / "kernels").iterdir()):
        files[f"kernels/{k.name}"] = k.read_text()
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", required=True, help="comma-separated names under skills/examples")
    ap.add_argument("--out", default="", help="append JSON lines here too")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--cache", default="/tmp/krl-cache")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from cluster.config import Config
    from sandbox_workers.evaluator import Evaluator

    cfg = Config()
    cfg.broker.cache_dir = args.cache
    cfg.sandbox.backend = "cuda"
    cfg.sandbox.compile_baseline = False
    cfg.sandbox.artifact_cache_dir = f"{args.cache}/artifacts"
    cfg.sandbox.baseline_cache_dir = f"{args.cache}/baselines"
    ev = Evaluator(cfg, "cuda")
    for name in args.examples.split(","):
        ex = ROOT / "skills" / "examples" / name
        t0 = time.monotonic()
        res = ev.evaluate((ex / "model.py").read_text(), solution_files(ex), mode="both")
        row = {"example": name, "reward": res["reward"], "correct": res["correct"], "error": res["error"][:500],
               "oracle_speedup": res["speedup_vs_eager"], "oracle_s": time.monotonic() - t0,
               "oracle_candidate": {k: (res["timings"].get("candidate") or {}).get(k) for k in ("median_s", "cv", "n", "batch")},
               "oracle_eager": {k: (res["timings"].get("eager") or {}).get(k) for k in ("median_s", "cv", "n", "batch")},
               "trusted_candidate": (res["timings"].get("candidate") or {}).get("trusted"),
               "trusted_eager": (res["timings"].get("eager") or {}).get("trusted")}
        try:
            row["harness"] = harness(ex, cfg, args.trials)
            if row["oracle_speedup"]:
                row["ratio"] = row["oracle_speedup"] / row["harness"]["speedup"]
        except Exception as exc:  # noqa: BLE001 - one example's failure is reported, the rest go on
            row["harness_error"] = f"{type(exc).__name__}: {exc}"[:800]
        line = json.dumps(row)
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
