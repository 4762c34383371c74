"""`kernelrl config show`: print the resolved configuration (TOML, or JSON with --json)."""
from __future__ import annotations

from cluster.json_stdout import emit


def add_arguments(p) -> None:
    p.add_argument("action", choices=["show"], nargs="?", default="show")
    p.add_argument("--json", action="store_true", help="print JSON instead of TOML")


def run(args, cfg) -> int:
    from cluster.config import dump_toml

    if cfg.bus.sasl_password:  # never echo secrets to terminals or logs
        cfg.bus.sasl_password = "***"
    if args.json:
        emit(cfg.to_dict(), indent=2)
    else:
        print(dump_toml(cfg))
    return 0
