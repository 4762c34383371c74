"""`kernelrl config show`: print the resolved configuration as TOML-like JSON."""
from __future__ import annotations

import json


def add_arguments(p) -> None:
    p.add_argument("action", choices=["show"], nargs="?", default="show")
    p.add_argument("--json", action="store_true", help="print JSON instead of TOML")


def _toml_value(v) -> str:
    return json.dumps(v)


def run(args, cfg) -> int:
    data = cfg.to_dict()
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    for section, values in data.items():
        print(f"[{section}]")
        for k, v in values.items():
            print(f"{k} = {_toml_value(v)}")
        print()
    return 0
