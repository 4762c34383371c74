"""`kernelrl bench bus|compile|actor|learner|weights|learning`: benchmarks printing ratios vs same-run baselines.

`bench bus` lives in cluster/bus/bench.py; the others are owned by their roles and
dispatched to ``<module>.run_bench(args, cfg) -> dict`` (imported only when asked).
"""
from __future__ import annotations

import argparse
import importlib

from cluster.errors import SetupError
from cluster.json_stdout import emit

TARGETS = {
    "bus": "cluster.bus.bench",
    "compile": "sandbox_workers.bench_compile",
    "actor": "actors.bench",
    "learner": "learner.bench",
    "weights": "cluster.weights.bench",
    "learning": "cluster.launch.bench_learning",
}


def _common(p) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--requests", type=int, default=500, help="bus: request/reply round trips to time")
    p.add_argument("--out", default="", help="also write the JSON result to this file")


def add_arguments(p) -> None:
    _common(p)
    p.add_argument("target", choices=sorted(TARGETS))
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="extra arguments for the target's own benchmark (args.rest)")


def _split_rest(args) -> None:
    """Options given after the target: ours (--json, --out, --requests) are taken, the rest stay."""
    ours = argparse.ArgumentParser(add_help=False)
    _common(ours)
    known, rest = ours.parse_known_args(args.rest or [])
    args.json = args.json or known.json
    args.out = args.out or known.out
    if "--requests" in (args.rest or []):
        args.requests = known.requests
    args.rest = rest


def _load(target: str):
    name = TARGETS[target]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise SetupError(f"`bench {target}` is not available: module {name} is not built yet") from None
        raise
    if not hasattr(module, "run_bench"):
        raise SetupError(f"`bench {target}`: {name} has no run_bench(args, cfg)")
    return module


def run(args, cfg) -> int:
    _split_rest(args)
    module = _load(args.target)
    if {"-h", "--help"} & set(args.rest):  # after the target, --help lands in rest: describe, never run
        print(f"kernelrl bench {args.target} [--json] [--out FILE] [target options]\n")
        print((module.__doc__ or "").strip())
        return 0
    result = module.run_bench(args, cfg)
    if result is None:
        return 0
    text = emit(result, indent=None if args.json else 2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0
