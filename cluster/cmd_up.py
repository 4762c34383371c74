"""`kernelrl up`: the whole loop on one machine (broker, topics, feeder, workers, actors,
learner) as supervised subprocesses, a live dashboard, and a JSON + PNG run report."""
from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["cpu", "cuda"], help="evaluation backend (default: sandbox.backend)")
    p.add_argument("--policy", choices=["vllm", "scripted"], help="actor policy (default: actor.policy)")
    p.add_argument("--model", help="model when actor.model_path is unset: tiny (default), smollm2, or a folder "
                                   "(default: cluster.model)")
    p.add_argument("--max-steps", type=int, help="learner steps before the run ends (default: cluster.max_steps)")
    p.add_argument("--duration", type=float, help="stop after S seconds whatever the learner did")
    p.add_argument("--report", help="run report path (JSON; PNG plots beside it)")
    p.add_argument("--actors", type=int, help="number of actor processes")
    p.add_argument("--compile-workers", type=int, help="number of compile workers")
    p.add_argument("--scripted-actors", type=int, help="extra actors replaying compile/verify/finish (tool traffic)")
    p.add_argument("--stages", help="learner stages in one run, e.g. rft:40@1e-3,ppo:60 (stage:steps[@lr]; "
                                    "sets the step count; default: learner.stage for --max-steps)")
    p.add_argument("--demonstrations", type=int, help="RFT demonstrations replayed from <task>.solution/ folders "
                                                     "(default: cluster.demonstrations)")
    p.add_argument("--tasks", help="folder of task files (default: the built-in task set)")
    p.add_argument("--chaos", type=float, default=0.0, metavar="SECONDS",
                   help="kill a random role with SIGKILL every ~SECONDS (fault injection; 0 = off)")
    p.add_argument("--chaos-broker", action="store_true",
                   help="chaos also kills the embedded broker's JVM (restarted on its port and data)")
    p.add_argument("--chaos-seed", type=int, help="replay a chaos run's choice of victims (the seed is logged)")
    p.add_argument("--no-dashboard", action="store_true", help="log progress lines instead of redrawing")


def run(args, cfg) -> int:
    from pathlib import Path

    from cluster.config import set_value, validate
    from cluster.errors import InputError
    from cluster.launch.run_loop import run_cluster

    if args.tasks is not None:
        from cluster.launch.feeder import load_task_files

        if not Path(args.tasks).is_dir():
            raise InputError(f"--tasks {args.tasks!r}: no such folder (it holds the task files to train on)")
        load_task_files(args.tasks)  # every file parses, before the broker and the roles start

    for flag, path in (("backend", "sandbox.backend"), ("policy", "actor.policy"), ("model", "cluster.model"), ("max_steps", "cluster.max_steps"),
                       ("duration", "cluster.duration_s"), ("report", "cluster.report_path"),
                       ("actors", "cluster.actors"), ("compile_workers", "cluster.compile_workers"),
                       ("scripted_actors", "cluster.scripted_actors"),
                       ("tasks", "cluster.task_dir"), ("stages", "learner.stages"),
                       ("demonstrations", "cluster.demonstrations")):
        value = getattr(args, flag)
        if value is not None:
            set_value(cfg, path, value)
    validate(cfg)  # --stages and the other flags, named, before anything starts
    report = run_cluster(cfg, chaos_every_s=args.chaos, dashboard=not args.no_dashboard,
                         config_path=args.config, overrides=args.set, chaos_broker=args.chaos_broker,
                         chaos_seed=args.chaos_seed, chaos_repeat=getattr(args, "chaos_repeat", False))
    if report.get("error"):
        print(f"report: {cfg.cluster.report_path}  (the run failed: {report['error']})")
        return 3
    print(f"report: {cfg.cluster.report_path}  "
          f"(steps {report['learner_steps']}, episodes {report['episodes_finished']}, "
          f"trained {report['trajectories_trained']}, lost {report['trajectories_lost']}, "
          f"tool calls lost {report['tool_calls_lost']}, broker restarts {report.get('broker_restarts', 0)}, "
          f"dead-lettered tasks {report.get('tasks_dead_lettered', 0)} / tool calls "
          f"{report.get('tool_calls_dead_lettered', 0)}, done twice: tasks {report.get('tasks_rolled_out_twice', 0)}"
          f" / tool calls {report.get('tool_calls_answered_twice', 0)})")
    return 0 if report.get("ok") else 1
