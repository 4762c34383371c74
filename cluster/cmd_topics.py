"""`kernelrl topics create|describe`: kernelrl's topics with their limits from config."""
from __future__ import annotations

from cluster.json_stdout import emit


def add_arguments(p) -> None:
    p.add_argument("action", choices=["create", "describe"])
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args, cfg) -> int:
    from cluster.bus import topics_admin

    if args.action == "create":
        result = topics_admin.create_all(cfg)
        if args.json:
            emit(result, indent=2)
        else:
            for name, what in result.items():
                print(f"{name}: {what}")
        return 0
    rows = topics_admin.describe(cfg)
    if args.json:
        emit(rows, indent=2)
    else:
        for r in rows:
            if not r["exists"]:
                print(f"{r['name']}: MISSING (run `kernelrl topics create`)")
                continue
            c = r["configs"]
            print(f"{r['name']}: partitions={r['partitions']} messages={r['messages']} "
                  f"retention.ms={c['retention.ms']} max.message.bytes={c['max.message.bytes']} "
                  f"compression.type={c['compression.type']}")
    return 0 if all(r["exists"] for r in rows) else 3
