"""Where a fresh judge's first shared hold goes (issue 12, session 24): per example, in a new process each, the
seconds of each step the judge takes before and inside its "reference" hold, synchronised after each.

    python3 docs/gpu/run20/ref_profile.py 'skills/examples/cuda_[14]*'   (on the GPU machine; JSON lines)
"""
from __future__ import annotations

import glob
import json
import subprocess
import sys
import time
from pathlib import Path


def one(path: str) -> dict:
    import torch

    from sandbox_workers.runner_common import load_task, seed_all

    out, t = {"task": path.split("/")[-2]}, time.perf_counter()

    def mark(name):
        nonlocal t
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        now = time.perf_counter()
        out[name] = round(now - t, 4)
        t = now

    torch.cuda.init()
    torch.empty(1, device="cuda")
    mark("context")
    task = load_task(Path(path).read_text())
    seed_all(1)
    model = task.Model(*task.get_init_inputs()).eval()
    mark("build_cpu")
    model = model.to("cuda")
    mark("place")
    with torch.device("cuda"):
        x = list(task.get_inputs())
    mark("inputs_1")
    with torch.no_grad():
        y = model(*x)
    mark("reference_1")
    ys = y if isinstance(y, (list, tuple)) else [y]
    bool(all(torch.isfinite(o).all() for o in ys))
    mark("isfinite_1")
    del y, ys
    with torch.device("cuda"):
        x = list(task.get_inputs())
    mark("inputs_2")
    with torch.no_grad():
        model(*x)
    mark("reference_2")
    t0 = time.perf_counter()
    torch.cuda.current_blas_handle()
    out["blas_handle_after"] = round(time.perf_counter() - t0, 4)
    out["peak_gb"] = round(torch.cuda.max_memory_reserved() / 1e9, 2)
    return out


def blas_first() -> dict:
    """A fresh process: the cuBLAS handle made before any matmul, then the first matmul."""
    import torch

    t0 = time.perf_counter()
    torch.empty(1, device="cuda")
    t1 = time.perf_counter()
    torch.cuda.current_blas_handle()
    t2 = time.perf_counter()
    a = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    (a @ a).sum().item()
    t4 = time.perf_counter()
    return {"task": "(cublas)", "context": round(t1 - t0, 4), "blas_handle": round(t2 - t1, 4),
            "randn_first": round(t3 - t2, 4), "matmul_first": round(t4 - t3, 4)}


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        print(json.dumps(one(sys.argv[2])), flush=True)
    elif sys.argv[1] == "--blas":
        print(json.dumps(blas_first()), flush=True)
    else:
        for p in sorted(glob.glob(sys.argv[1] + "/model.py")) + ["--blas"]:
            args = ["--blas"] if p == "--blas" else ["--one", p]
            r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, timeout=300)
            print(r.stdout.strip() or json.dumps({"task": p, "error": r.stderr[-800:]}), flush=True)
