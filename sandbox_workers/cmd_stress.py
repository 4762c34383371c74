"""`kernelrl stress sandbox --duration S [--rate R] [--tasks DIR] [--workers 1,2] --json`: flood the sandbox topics.

Without --workers it loads the workers already serving; with --workers it starts 1, 2, ... evaluation workers
itself, one step per count, and reports the scaling (sandbox_workers/stress_scaling.py).
"""
from __future__ import annotations

import logging

from cluster.json_stdout import emit

# progress lines go to stderr through the log even without -v: a stress run takes minutes
_PROGRESS_LOGGERS = ("sandbox_workers.stress", "sandbox_workers.stress_load", "sandbox_workers.stress_scaling")


def add_arguments(p) -> None:
    p.add_argument("target", choices=["sandbox"])
    p.add_argument("--duration", type=float, default=30.0, help="seconds of sending (per step with --workers)")
    p.add_argument("--rate", type=float, default=2.0, help="requests per second (open loop; not with --workers)")
    p.add_argument("--tasks", default="", help="task corpus folder (e.g. ../shared/kernelbench); shapes shrunk")
    p.add_argument("--backend", choices=["cpu", "cuda"], default=None, help="default: sandbox.backend")
    p.add_argument("--eval-fraction", type=float, default=None,
                   help="share of evaluate (vs compile) requests (default 0.5; 1.0 with --workers)")
    p.add_argument("--cache-hits", type=float, default=0.0, help="share of compile requests repeating a build")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request reply timeout (s)")
    p.add_argument("--examples", default="*", help="glob over skills/examples/<backend>_* names to use")
    p.add_argument("--workers", default="",
                   help="worker counts, e.g. 1,2: start that many evaluation workers per step (own cores each), "
                        "load them at saturation (closed loop), report evaluations/min and the scaling efficiency")
    p.add_argument("--cores-per-worker", type=int, default=0,
                   help="with --workers: cores of each CPU evaluation worker (default: (allowed cores - 1) // largest "
                        "count, at least 1: one core left to the broker, compile worker and load generator)")
    p.add_argument("--compile-workers", type=int, default=1, help="with --workers: compile workers per step")
    p.add_argument("--in-flight", type=int, default=0,
                   help="closed loop instead of --rate: this many requests kept in flight per partition of the evaluate "
                        "topic (a saturating load without a backlog)")
    p.add_argument("--warmup", action="store_true",
                   help="first one evaluation per partition, all answered, not counted (warm pools, caches)")
    p.add_argument("--raw-timeline", default="", metavar="FILE",
                   help="write every gate hold, request time and GPU sample of the run to FILE (JSON)")
    p.add_argument("--json", action="store_true")


def run(args, cfg) -> int:
    from cluster.errors import KernelRLError

    if args.rate <= 0 or args.duration <= 0 or args.in_flight < 0:
        raise KernelRLError("--rate and --duration must be > 0, --in-flight >= 0")
    for name in _PROGRESS_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
    backend = args.backend or cfg.sandbox.backend
    try:
        out = _scaling(args, cfg, backend) if args.workers else _flood(args, cfg, backend)
    except ValueError as exc:
        raise KernelRLError(str(exc)) from None
    emit(out, indent=None if args.json else 2)
    return 0


def _flood(args, cfg, backend: str) -> dict:
    from sandbox_workers.stress import run_stress
    return run_stress(cfg, backend, args.duration, args.rate, args.tasks or None,
                      0.5 if args.eval_fraction is None else args.eval_fraction, args.cache_hits,
                      timeout_s=args.timeout, examples=args.examples, closed_loop=args.in_flight,
                      warmup_every_partition=args.warmup, raw_timeline=args.raw_timeline)


def _scaling(args, cfg, backend: str) -> dict:
    from sandbox_workers.stress_scaling import parse_counts, run_scaling

    if args.cores_per_worker < 0 or args.compile_workers < 1:
        raise ValueError("--cores-per-worker must be >= 0 and --compile-workers >= 1")
    return run_scaling(cfg, backend, parse_counts(args.workers), args.duration, tasks_dir=args.tasks or None,
                       eval_fraction=1.0 if args.eval_fraction is None else args.eval_fraction,
                       cache_hits=args.cache_hits, timeout_s=args.timeout, examples=args.examples,
                       cores_per_worker=args.cores_per_worker, compile_workers=args.compile_workers)
