"""`kernelrl eval-worker --device N|cpu`: consume tool.evaluate.<kind>, verify + profile, reply with the reward."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    p.add_argument("--device", default="cpu", help="GPU index to pin to (by NVML UUID), or 'cpu'")
    p.add_argument("--group", default="", help="consumer group (default: eval-workers-<kind>)")
    p.add_argument("--max-messages", type=int, default=0, help="exit after this many requests (0 = run until SIGTERM)")


def run(args, cfg) -> int:
    import threading

    from sandbox_workers import ossandbox

    try:
        ossandbox.require(cfg)  # fail closed: no OS sandbox, no serving (unless sandbox.isolation = "none")
    except ossandbox.IsolationUnavailable as exc:
        log.error("refusing to serve: %s", exc)
        return 2

    from cluster.errors import SetupError

    backend = "cpu" if args.device == "cpu" else "cuda"
    from sandbox_workers import cpu_profile

    why = cpu_profile.available() if cpu_profile.enabled(cfg.sandbox, backend) else ""
    if why:  # fail closed: the no-torch-compute rule would rest on the candidate's own word
        log.error("refusing to serve: %s (sandbox.cpu_profile = \"off\" serves without the check)", why)
        return 2
    ident, device_key = None, ""
    if backend == "cpu" and cfg.sandbox.cpu_cores:
        from sandbox_workers import cpuset

        cpuset.pin(cpuset.parse(cfg.sandbox.cpu_cores))  # before any thread: the sandboxes inherit it
        log.info("pinned to cores %s", cfg.sandbox.cpu_cores)
    if backend == "cuda":
        from sandbox_workers import gpu

        if not args.device.isdigit():
            raise SetupError(f"--device: expected a GPU index or 'cpu', got {args.device!r}")
        ident = gpu.pin(int(args.device))  # before anything initialises CUDA
        log.info("GPU health: %s", gpu.health_check())
        locked = gpu.lock_clocks(ident["handle"]) if cfg.sandbox.lock_clocks else None
        device_key = f"cuda:{ident['name']}:locked={locked}"
    from cluster.bus.client import Bus, RequestClient, serve
    from sandbox_workers.worker import Abandoned, EvalHandler, install_sigterm, worker_name
    from schemas import topics
    from schemas.messages import EvaluateRequest, FilterRequest

    stop = threading.Event()
    install_sigterm(stop)
    from cluster import metrics

    name = worker_name(f"eval-{backend}")
    bus = Bus(cfg, client_id=name)
    bus.ensure_topics()
    # artifacts the worker's cache lacks come from the compile workers by content key (Evaluator._artifact)
    client = RequestClient(bus, name=name)
    handler = metrics.Metered(EvalHandler(cfg, backend, device_key=device_key, client=client))
    metrics.serve_from_env("eval-worker", cfg.cluster.metrics_host, name=handler.name, backend=backend,
                           device=device_key)
    topic = topics.evaluate_topic(backend)
    log.info("eval worker %s serving %s (%d job(s) at once)", handler.name, bus.topic(topic), handler.jobs)
    try:
        # sandbox.jobs_per_device requests at once (handler threads): pipelined on the device, timing exclusive
        stats = serve(bus, topic, bus.group(args.group or f"eval-workers-{backend}"), handler, stop,
                      expected=(EvaluateRequest, FilterRequest),
                      max_messages=args.max_messages or None, concurrency=handler.jobs)
        log.info("eval worker done: %s", stats)
    except Abandoned:
        log.info("eval worker stopped mid-job; the job stays uncommitted")
    finally:
        handler.close()
        client.close()
        bus.close()
        if ident is not None and cfg.sandbox.lock_clocks:
            from sandbox_workers import gpu
            gpu.unlock_clocks(ident["handle"])
    return 0
