"""`kernelrl eval`: KernelBench-style evaluation of a policy or of a folder of ready solutions.

Writes DIR/eval.json (overall, per level, per task) and DIR/eval.png, prints a per-level
table: pass rate, fast_1 vs eager and vs torch.compile, geometric-mean speed-ups. Each task's
result is appended to DIR/results.jsonl and a progress line goes to stderr as it finishes, so a
run stopped half-way keeps (and shows) what it finished.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from cluster.json_stdout import emit


def add_arguments(p) -> None:
    p.add_argument("--tasks", required=True, help="task folder (kernelrl index.json or a KernelBench checkout)")
    p.add_argument("--policy", choices=["solutions", "vllm", "openai"], default="solutions")
    p.add_argument("--solutions", help="--policy solutions: folder with one solution per task "
                                      "(<stem>/model_new.py + kernels/, or <stem>.py holding ModelNew)")
    p.add_argument("--backend", choices=["cpu", "cuda"], default=None, help="default: sandbox.backend")
    p.add_argument("--task-backend", default=None,
                   help="only tasks sized for this backend: cpu, cuda or all (default: --backend; tasks of a "
                        "folder without index.json count as sized for --backend)")
    p.add_argument("--level", type=int, default=None)
    p.add_argument("--limit", type=int, default=0, help="first N tasks only")
    p.add_argument("--only-solved", action="store_true",
                   help="evaluate only the tasks that have a solution (the default counts missing ones as failed)")
    p.add_argument("--via", choices=["local", "bus"], default="local",
                   help="local: the sandbox's one-shot evaluator here; bus: the sandbox workers over Kafka")
    p.add_argument("--shrink-inputs", type=int, default=0, metavar="N",
                   help="halve the tasks' shape constants until get_inputs() holds <= N elements (GPU-sized "
                        "sets on a CPU; the report marks the tasks shrunk)")
    p.add_argument("--workers", type=int, default=1, help="evaluations in parallel (timings are fairer with 1)")
    p.add_argument("--model-path", default="", help="--policy vllm|openai: model/tokenizer path")
    p.add_argument("--out", default="kernelrl-eval", help="report folder (eval.json, eval.png)")
    p.add_argument("--json", action="store_true", help="print the overall summary as JSON")


def run(args, cfg) -> int:
    from cluster.tasks.metrics import plot, report, table

    backend = args.backend or cfg.sandbox.backend
    entries, resolved, shrunk = _prepare(args, cfg, backend)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with Progress(out / "results.jsonl", len(entries)) as progress:
        results = _results(args, cfg, entries, backend, progress, resolved)
    meta = {"tasks": str(args.tasks), "policy": args.policy, "solutions": args.solutions, "backend": backend,
            "via": args.via, "n_tasks": len(entries), "shrink_inputs": args.shrink_inputs, "shrunk": shrunk}
    rep = report(results, meta)
    (out / "eval.json").write_text(json.dumps(rep, indent=1) + "\n")
    plot(rep, str(out / "eval.png"), title=f"kernelrl eval: {args.policy} on {Path(args.tasks).name} ({backend})")
    if args.json:
        emit(rep["overall"])
    else:
        print(table(rep))
        print(f"report: {out / 'eval.json'}  plot: {out / 'eval.png'}", file=sys.stderr)
    return 0


def _prepare(args, cfg, backend: str):
    """The tasks to run, their solutions (looked up before any shrinking) and the shapes shrunk."""
    from cluster.tasks.dataset import load_tasks
    from cluster.tasks.evaluate import find_solution
    from cluster.errors import KernelRLError

    entries = load_tasks(args.tasks, backend=args.task_backend or backend, level=args.level, default_backend=backend)
    for e in entries:
        e.backend = backend  # evaluated on this backend whatever size the task was made for
    resolved = None
    if args.policy == "solutions":
        if not args.solutions or not Path(args.solutions).is_dir():
            raise KernelRLError(f"--policy solutions needs --solutions DIR (got {args.solutions!r})")
        # looked up now: a solution found by its task's source no longer matches once shapes are shrunk
        resolved = {e.task_id: find_solution(Path(args.solutions), e) for e in entries}
        if args.only_solved:
            entries = [e for e in entries if resolved[e.task_id] is not None]
    if args.limit:
        entries = entries[:args.limit]
    if not entries:
        raise KernelRLError("no tasks to evaluate")
    shrunk = {}
    if args.shrink_inputs > 0:
        from cluster.tasks.shrink import shrink_task

        for e in entries:
            e.model_py, changes = shrink_task(e.model_py, args.shrink_inputs)
            if changes:
                shrunk[e.task_id] = changes
    return entries, resolved, shrunk


class Progress:
    """Appends each finished task to results.jsonl and prints one line per task with a solution."""

    def __init__(self, path: Path, total: int):
        self.path, self.total, self.done, self.t0 = path, total, 0, time.monotonic()
        self._lock = threading.Lock()
        self._f = None

    def __enter__(self) -> "Progress":
        self._f = self.path.open("w")
        return self

    def __exit__(self, *exc) -> None:
        self._f.close()

    def __call__(self, res) -> None:
        with self._lock:
            self.done += 1
            self._f.write(json.dumps(res.to_dict()) + "\n")
            self._f.flush()
            if not res.has_solution:
                return
            state = "correct" if res.correct else ("wrong" if res.compiled else "not compiled")
            extra = f" violations={','.join(res.violations)}" if res.violations else ""
            print(f"[{self.done}/{self.total} {time.monotonic() - self.t0:.0f}s] {res.task_id}: {state}, "
                  f"reward {res.reward:g}, {res.speedup_vs_eager:.3f}x eager, {res.speedup_vs_compile:.3f}x compile "
                  f"({res.duration_s:.1f} s){extra}", file=sys.stderr, flush=True)


def _results(args, cfg, entries, backend, progress, resolved):
    from cluster.tasks.evaluate import BusSolutions, LocalSolutions, run_episodes, run_solutions

    if args.policy != "solutions":
        import asyncio

        cfg.actor.policy = args.policy
        return asyncio.run(run_episodes(cfg, entries, args.model_path, on_result=progress))
    runner = BusSolutions(cfg, backend) if args.via == "bus" else LocalSolutions(cfg, backend, args.workers)
    try:
        return run_solutions(entries, resolved, runner, workers=args.workers, on_result=progress)
    finally:
        runner.close()
