"""`kernelrl stress sandbox --duration S [--rate R] [--tasks DIR] --json`: flood the sandbox topics."""
from __future__ import annotations

from cluster.json_stdout import emit


def add_arguments(p) -> None:
    p.add_argument("target", choices=["sandbox"])
    p.add_argument("--duration", type=float, default=30.0, help="seconds of sending")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second (open loop)")
    p.add_argument("--tasks", default="", help="task corpus folder (e.g. ../shared/kernelbench); shapes shrunk")
    p.add_argument("--backend", choices=["cpu", "cuda"], default=None, help="default: sandbox.backend")
    p.add_argument("--eval-fraction", type=float, default=0.5, help="share of evaluate (vs compile) requests")
    p.add_argument("--cache-hits", type=float, default=0.0, help="share of compile requests repeating a build")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request reply timeout (s)")
    p.add_argument("--examples", default="*", help="glob over skills/examples/<backend>_* names to use")
    p.add_argument("--json", action="store_true")


def run(args, cfg) -> int:
    from cluster.errors import KernelRLError
    from sandbox_workers.stress import run_stress

    if args.rate <= 0 or args.duration <= 0:
        raise KernelRLError("--rate and --duration must be > 0")
    try:
        out = run_stress(cfg, args.backend or cfg.sandbox.backend, args.duration, args.rate, args.tasks or None,
                         args.eval_fraction, args.cache_hits, timeout_s=args.timeout,
                         examples=args.examples)
    except ValueError as exc:
        raise KernelRLError(str(exc)) from None
    emit(out, indent=None if args.json else 2)
    return 0
