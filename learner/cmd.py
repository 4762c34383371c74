"""`kernelrl learner`: run the DeepSpeed PPO learner (one process per rank; thin entry point).

Single process by default; for several ranks start one process per rank with
RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT set, or run it under
a launcher that sets them (`torchrun --nproc-per-node G -m cluster.cli learner`,
`deepspeed --no_local_rank --module cluster.cli learner`). SIGTERM / SIGINT finish the current
step, checkpoint what it trained, and exit 0 (torchrun forwards SIGTERM to every
rank).
"""
from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


def add_arguments(p) -> None:
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps in total (0 = run forever)")
    p.add_argument("--model", default="", help="initial policy folder (default: learner.model_path, "
                                               "actor.model_path, else the tiny model)")
    p.add_argument("--checkpoint-dir", default="", help="default: learner.checkpoint_dir or <cache>/learner-ckpt")
    p.add_argument("--idle-wait", type=float, default=3600.0,
                   help="seconds to wait for a batch before checking again")


def run(args, cfg) -> int:
    from cluster import metrics
    from learner import engine as eng

    eng.setup_env(cfg)  # before deepspeed is imported anywhere
    from cluster.bus.client import Bus
    from learner.role import LearnerRole, default_ckpt_dir, ensure_dir, model_path_for

    stop = threading.Event()

    def _on_signal(signum, _frame):
        log.warning("%s: finishing the current step, then stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    eng.init_distributed()
    rank, world = eng.rank_world()
    log.info("learner rank %d of %d (%s)", rank, world, eng.launcher_summary())
    if eng.local_rank() == 0:
        # the first rank of each node serves /healthz and /metrics: every learner pod of a multi-node job
        # answers its probes; only global rank 0 reads Kafka and publishes (the `rank` info tells them apart)
        metrics.serve_from_env("learner", cfg.cluster.metrics_host, stage=cfg.learner.stage, world=str(world),
                               rank=str(rank))
    from cluster.models.importer import resolve_model_path

    model = resolve_model_path(cfg, args.model) if args.model else model_path_for(cfg)
    cfg.learner.critic_model_path = resolve_model_path(cfg, cfg.learner.critic_model_path)
    ckpt_dir = ensure_dir(args.checkpoint_dir or default_ckpt_dir(cfg))
    bus = Bus(cfg, client_id=f"learner-{rank}") if rank == 0 else None
    role = LearnerRole(cfg, model, ckpt_dir, bus)
    try:
        done = role.run(max_steps=args.max_steps, stop=stop, idle_wait_s=args.idle_wait)
        log.info("learner stopped after %d steps this run (step %d, policy version %d)", done, role.step,
                 role.version)
    finally:
        role.close()
        if bus is not None:
            bus.close()
    return 0
