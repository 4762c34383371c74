"""`kernelrl actor`: run one rollout actor (asyncio on uvloop) until SIGTERM."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    p.add_argument("--id", default="", help="actor id (default: actor-<host>-<pid>)")
    p.add_argument("--model", default="", help="model folder (default: actor.model_path, else the tiny model)")
    p.add_argument("--max-episodes", type=int, default=0, help="exit after this many trajectories (0 = run on)")
    p.add_argument("--eval", action="store_true", help="use the evaluation turn cap (actor.eval_max_turns)")


def resolve_model(cfg, explicit: str = "") -> str:
    if explicit or cfg.actor.model_path:
        from cluster.models.importer import resolve_model_path  # a named built-in ("smollm2", "tiny") -> its folder

        return resolve_model_path(cfg, explicit or cfg.actor.model_path)
    from cluster.models.tiny import build_tiny_model, default_tiny_model_dir

    return build_tiny_model(default_tiny_model_dir(cfg))


async def _main(args, cfg) -> int:
    import asyncio
    import signal

    from actors.actor import Actor
    from actors.agent import PolicyFailure
    from actors.policy import make_policy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    from cluster import metrics

    metrics.serve_from_env("actor", cfg.cluster.metrics_host, policy=cfg.actor.policy)
    model = resolve_model(cfg, args.model)
    policy = await make_policy(cfg, model)
    try:
        actor = Actor(cfg, policy, actor_id=args.id or None, evaluation=args.eval)
        await loop.run_in_executor(None, actor.bus.ensure_topics)
        log.info("actor %s up: policy %s, model %s, concurrency %d", actor.actor_id, policy.name, model,
                 cfg.actor.concurrency)
        try:
            published = await actor.run(stop, max_episodes=args.max_episodes or None)
        except PolicyFailure:
            if not stop.is_set():
                raise
            # SIGTERM sent to our whole process group also stopped vLLM's engine processes: the
            # episodes it cut short stay uncommitted (redelivered); this is a clean stop.
            log.info("actor %s: engine stopped with the actor; unfinished tasks left uncommitted", actor.actor_id)
            published = actor.stats["published"]
        log.info("actor %s stopped: %d trajectories, stats %s", actor.actor_id, published, actor.stats)
        await loop.run_in_executor(None, actor.close)
    finally:
        await policy.close()
    return 0


def run(args, cfg) -> int:
    import uvloop

    from actors.agent import PolicyFailure

    try:
        return uvloop.run(_main(args, cfg))
    except PolicyFailure as exc:
        log.error("actor stopped: the policy failed: %s", exc)
        return 1
