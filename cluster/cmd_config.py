"""`kernelrl config show`: print the resolved configuration (TOML, or JSON with --json)."""
from __future__ import annotations

import json


def add_arguments(p) -> None:
    p.add_argument("action", choices=["show"], nargs="?", default="show")
    p.add_argument("--json", action="store_true", help="print JSON instead of TOML")


def run(args, cfg) -> int:
    from cluster.config import dump_toml

    if cfg.bus.sasl_password:  # never echo secrets to terminals or logs
        cfg.bus.sasl_password = "***"
    print(json.dumps(cfg.to_dict(), indent=2) if args.json else dump_toml(cfg))
    return 0
