"""`kernelrl sandbox eval --task FILE --solution DIR`: compile + verify + profile locally, no bus."""
from __future__ import annotations

from cluster.json_stdout import emit


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    e = sub.add_parser("eval", help="evaluate one solution folder against one task file")
    e.add_argument("--task", required=True, help="KernelBench-style task file (class Model, get_inputs, ...)")
    e.add_argument("--solution", required=True, help="folder with model_new.py and kernels/")
    e.add_argument("--backend", choices=["cpu", "cuda"], default=None, help="default: sandbox.backend")
    e.add_argument("--mode", choices=["verify", "profile", "both"], default="both")
    e.add_argument("--json", action="store_true", help="print one JSON object")


def run(args, cfg) -> int:
    from pathlib import Path

    from cluster.errors import InputError, KernelRLError
    from sandbox_workers import workspace
    from sandbox_workers.evaluator import Evaluator

    task = Path(args.task)
    if not task.is_file():
        raise InputError(f"--task {str(task)!r}: no such file")
    backend = args.backend or cfg.sandbox.backend
    if backend == "cuda":
        import os
        if os.environ.get("CUDA_VISIBLE_DEVICES", "").isdigit() or "CUDA_VISIBLE_DEVICES" not in os.environ:
            try:
                from sandbox_workers import gpu
                gpu.pin(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0") or 0))
            except KernelRLError:
                raise
            except Exception:  # noqa: BLE001 - NVML unavailable: let the child find the GPU itself
                pass
    source = task.read_text()
    try:
        compile(source, str(task), "exec")
    except SyntaxError as exc:
        raise InputError(f"--task {str(task)!r}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    if not Path(args.solution).is_dir():
        raise InputError(f"--solution {args.solution!r}: no such folder (it holds model_new.py and kernels/)")
    files = workspace.read_dir(args.solution)
    result = Evaluator(cfg, backend).evaluate(source, files, mode=args.mode)
    if args.json:
        emit(result)
    else:
        _pretty(result)
    return 0 if result["correct"] else 1


def _pretty(r: dict) -> None:
    print(f"compiled: {r['compiled']}  correct: {r['correct']}  reward: {r['reward']:+.0f}")
    print(f"speed-up vs eager: {r['speedup_vs_eager']:.3f}x  vs torch.compile: {r['speedup_vs_compile']:.3f}x")
    for name, t in (r.get("timings") or {}).items():
        if t.get("median_s"):
            print(f"  {name:9s} median {t['median_s'] * 1e3:9.3f} ms  (n={t['n']}, cv={t.get('cv', 0):.3f})")
    if r["violations"]:
        print("violations:", ", ".join(r["violations"]))
    if r["error"]:
        print("error:", r["error"])
    log = (r.get("evidence") or {}).get("compile", {}).get("log")
    if log:
        print("compiler output:\n" + log)
