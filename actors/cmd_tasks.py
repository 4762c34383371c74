"""`kernelrl tasks`: synthesize, import, list and publish task sets."""
from __future__ import annotations

import json
import sys
from pathlib import Path

BUILTIN = Path(__file__).resolve().parents[1] / "cluster" / "tasks" / "builtin"


def add_arguments(p) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("synthesize", help="compose, filter and decontaminate new tasks into a folder")
    s.add_argument("--n", type=int, required=True, help="how many tasks to keep")
    s.add_argument("--backend", choices=["cpu", "cuda"], default="cpu", help="size the tasks for this backend")
    s.add_argument("--out", required=True, help="output folder (index.json is merged if present)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--mix", default="", help="operator-count weights, e.g. '1:0.1,2:0.6,3:0.2,4:0.05,5:0.05' "
                                            "(default: CUDA-Agent-Ops-6K's mix)")
    s.add_argument("--workers", type=int, default=1, help="parallel filter children (with --via bus: requests in flight)")
    s.add_argument("--via", choices=["local", "bus"], default="local",
                   help="local: sandboxed children here; bus: the evaluation workers over Kafka (scales with them)")
    s.add_argument("--min-ms", type=float, default=-1.0, help="eager runtime window low end (default per backend)")
    s.add_argument("--max-ms", type=float, default=-1.0, help="eager runtime window high end")
    s.add_argument("--no-compile-check", action="store_true", help="skip the torch.compile rules (faster)")
    s.add_argument("--eval-set", default=None, help="decontamination set (default: $KERNELRL_KERNELBENCH or "
                                                   "../shared/kernelbench); '' disables")
    s.add_argument("--threshold", type=float, default=0.9, help="AST similarity above which a task is dropped")
    s.add_argument("--verify", choices=["auto", "direct", "twin"], default="auto",
                   help="twin: check GPU-sized tasks through their CPU-sized twin (auto when no GPU)")
    s.add_argument("--max-candidates", type=int, default=0)
    s.add_argument("--llm-share", type=float, default=0.0,
                   help="share of candidates composed by the LLM at actor.openai_base_url/actor.openai_model")
    i = sub.add_parser("import", help="copy a folder of KernelBench-style tasks into a kernelrl task folder")
    i.add_argument("src", help="e.g. a KernelBench checkout (level1/, level2/, ...)")
    i.add_argument("--out", required=True)
    i.add_argument("--backend", choices=["cpu", "cuda"], default="cuda")
    i.add_argument("--levels", default="", help="comma-separated levels to import (default: all)")
    v = sub.add_parser("verify", help="re-run the execution filter on a task folder (e.g. GPU-sized tasks on a GPU)")
    v.add_argument("--dir", default=None, help="default: cluster.task_dir or the built-in set")
    v.add_argument("--backend", choices=["cpu", "cuda"], default=None, help="default: sandbox.backend")
    v.add_argument("--workers", type=int, default=1, help="parallel filter children (with --via bus: requests in flight)")
    v.add_argument("--via", choices=["local", "bus"], default="local",
                   help="local: sandboxed children here; bus: the evaluation workers over Kafka")
    v.add_argument("--min-ms", type=float, default=-1.0)
    v.add_argument("--max-ms", type=float, default=-1.0)
    v.add_argument("--no-compile-check", action="store_true")
    v.add_argument("--write", action="store_true",
                   help="record the measured runtimes in index.json (runtime_verified=true for the passing tasks)")
    ls = sub.add_parser("list", help="list the tasks of a folder")
    ls.add_argument("--dir", default=None, help="default: cluster.task_dir or the built-in set")
    ls.add_argument("--backend", default="all")
    pub = sub.add_parser("publish", help="send tasks to the tasks topic (schemas.Task, key = task id)")
    pub.add_argument("--dir", default=None, help="default: cluster.task_dir or the built-in set")
    pub.add_argument("--backend", default=None, help="cpu, cuda or all (default: sandbox.backend)")
    pub.add_argument("--level", type=int, default=None)
    pub.add_argument("--limit", type=int, default=0)
    pub.add_argument("--repeat", type=int, default=1, help="publish the set this many times (ids get @round)")


def run(args, cfg) -> int:
    actions = {"synthesize": _synthesize, "import": _import, "list": _list, "publish": _publish, "verify": _verify}
    return actions[args.action](args, cfg)


def _task_dir(args, cfg) -> Path:
    return Path(args.dir or cfg.cluster.task_dir or BUILTIN)


def _synthesize(args, cfg) -> int:
    from cluster.tasks.filter import FilterConfig
    from cluster.tasks.pipeline import CUDA_AGENT_MIX, SynthConfig, parse_mix, synthesize
    from cluster.errors import KernelRLError

    if args.n <= 0:
        raise KernelRLError(f"--n must be > 0, got {args.n}")
    try:
        mix = parse_mix(args.mix) if args.mix else dict(CUDA_AGENT_MIX)
    except ValueError as exc:
        raise KernelRLError(str(exc)) from None
    llm = None
    if args.llm_share > 0:
        from cluster.tasks.llm import LLMComposer
        llm = LLMComposer.from_config(cfg)
    fcfg = FilterConfig(backend=args.backend, min_ms=args.min_ms, max_ms=args.max_ms,
                        check_compile=not args.no_compile_check, atol=cfg.sandbox.atol, rtol=cfg.sandbox.rtol)
    checker = _bus_checker(args, cfg)
    sc = SynthConfig(n=args.n, backend=args.backend, out=Path(args.out), seed=args.seed, mix=mix,
                     workers=args.workers, filter=fcfg, eval_dir=args.eval_set, threshold=args.threshold,
                     max_candidates=args.max_candidates, verify=args.verify, llm=llm, llm_share=args.llm_share,
                     checker=checker)
    try:
        report = synthesize(sc)
    finally:
        if checker is not None:
            checker.close()
    print(json.dumps(report.summary(), indent=1))
    if len(report.accepted) < args.n:
        print(f"kernelrl tasks: only {len(report.accepted)} of {args.n} tasks passed; raise --max-candidates",
              file=sys.stderr)
        return 1
    return 0


def _bus_checker(args, cfg):
    """With --via bus: a filter that runs on the evaluation workers (they must be running)."""
    if args.via != "bus":
        return None
    from cluster.tasks.filter_bus import BusFilter
    return BusFilter(cfg, concurrency=args.workers)


def _import(args, cfg) -> int:
    from cluster.tasks.dataset import import_dir

    levels = [int(x) for x in args.levels.split(",") if x.strip()] if args.levels else None
    entries = import_dir(args.src, args.out, backend=args.backend, levels=levels)
    print(f"imported {len(entries)} tasks into {args.out}")
    return 0


def _verify(args, cfg) -> int:
    from cluster.tasks.dataset import load_tasks, write_index
    from cluster.tasks.filter import FilterConfig
    from cluster.tasks.filter_runner import filter_sources

    backend = args.backend or cfg.sandbox.backend
    folder = _task_dir(args, cfg)
    entries = load_tasks(folder, backend=backend, include_rejected=True)
    fcfg = FilterConfig(backend=backend, min_ms=args.min_ms, max_ms=args.max_ms,
                        check_compile=not args.no_compile_check, atol=cfg.sandbox.atol, rtol=cfg.sandbox.rtol)
    checker = _bus_checker(args, cfg)
    if checker is None:
        verdicts = filter_sources([e.model_py for e in entries], fcfg, workers=args.workers)
    else:
        try:
            verdicts = checker([e.model_py for e in entries], fcfg)
        finally:
            checker.close()
    failed = 0
    for e, v in zip(entries, verdicts):
        failed += not v.ok
        status = "ok" if v.ok else f"REJECT {v.rule}: {v.reason[:100]}"
        print(f"{e.task_id:28s} {v.eager_ms:9.3f} ms  {e.name[:48]:48s} {status}")
        if args.write:
            _record_verdict(e, v, backend, fcfg.check_compile)
    if args.write:  # rejected tasks stay in the index, marked, so `tasks verify` can look at them again
        write_index(folder, entries)
    print(f"{len(entries) - failed}/{len(entries)} tasks pass the filter on {backend}")
    return 0 if failed == 0 else 1


def _record_verdict(entry, verdict, backend: str, compiled: bool) -> None:
    """Pass: the measured runtime, runtime_verified. Reject: why, so load_tasks leaves the task out."""
    meta = entry.metadata
    if verdict.ok:
        meta.setdefault("filter", {}).update(eager_ms=round(verdict.eager_ms, 4), backend=backend, compiled=compiled)
        meta["runtime_verified"] = True
        meta.pop("rejected", None)
    else:
        meta["runtime_verified"] = False
        meta["rejected"] = {"backend": backend, "rule": verdict.rule, "reason": verdict.reason[:300],
                            "eager_ms": round(verdict.eager_ms, 4)}


def _list(args, cfg) -> int:
    from cluster.tasks.dataset import load_tasks

    for e in load_tasks(_task_dir(args, cfg), backend=args.backend, include_rejected=True):
        rej = e.metadata.get("rejected")
        mark = f"  REJECTED on {rej.get('backend')}: {rej.get('rule')}" if rej else ""
        print(f"{e.task_id:32s} {e.backend:4s} L{e.level} {e.name}{mark}")
    return 0


def _publish(args, cfg) -> int:
    from cluster.tasks.dataset import load_tasks
    from cluster.bus.client import Bus
    from schemas import topics

    backend = args.backend or cfg.sandbox.backend
    entries = load_tasks(_task_dir(args, cfg), backend=backend, level=args.level)
    if args.limit:
        entries = entries[:args.limit]
    bus = Bus(cfg, client_id="task-publisher")
    prod = bus.producer()
    sent = 0
    try:
        for r in range(max(1, args.repeat)):
            for e in entries:
                msg = e.to_message()
                if args.repeat > 1:
                    msg.task_id = f"{e.task_id}@{r}"
                prod.send(topics.TASKS, msg, key=msg.task_id)
                sent += 1
        prod.flush()
    finally:
        prod.close()
        close = getattr(bus, "close", None)
        if close:
            close()
    print(f"published {sent} tasks to {cfg.topic(topics.TASKS)}")
    return 0
