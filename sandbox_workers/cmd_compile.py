"""`kernelrl compile-worker`: consume tool.compile, build workspaces, reply with the artifact."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    p.add_argument("--group", default="compile-workers", help="consumer group (workers of a group share requests)")
    p.add_argument("--max-messages", type=int, default=0, help="exit after this many requests (0 = run until SIGTERM)")
    p.add_argument("--jobs", type=int, default=0,
                   help="builds at once (default: sandbox.compile_concurrency); cache hits do not wait behind builds")


def run(args, cfg) -> int:
    import threading

    from sandbox_workers import ossandbox

    try:
        ossandbox.require(cfg)  # fail closed: no OS sandbox, no serving (unless sandbox.isolation = "none")
    except ossandbox.IsolationUnavailable as exc:
        log.error("refusing to serve: %s", exc)
        return 2

    from cluster.bus.client import Bus, serve
    from sandbox_workers.worker import Abandoned, CompileHandler, install_sigterm
    from schemas import topics
    from schemas.messages import CompileRequest

    stop = threading.Event()
    install_sigterm(stop)
    from cluster import metrics

    handler = metrics.Metered(CompileHandler(cfg))
    metrics.serve_from_env("compile-worker", cfg.cluster.metrics_host, name=handler.name)
    bus = Bus(cfg, client_id=handler.name)
    bus.ensure_topics()
    log.info("compile worker %s serving %s", handler.name, bus.topic(topics.TOOL_COMPILE))
    try:
        stats = serve(bus, topics.TOOL_COMPILE, bus.group(args.group), handler, stop, expected=CompileRequest,
                      max_messages=args.max_messages or None,
                      concurrency=max(1, args.jobs or cfg.sandbox.compile_concurrency))
    except Abandoned:
        log.info("compile worker stopped mid-job; the job stays uncommitted")
        return 0
    finally:
        bus.close()
    log.info("compile worker done: %s", stats)
    return 0
