"""`kernelrl replay`: select trajectories by offset or time range (and task, reward,
policy version) and send them to a topic, to files, or to a fresh learner namespace."""
from __future__ import annotations

import json


def add_arguments(p) -> None:
    p.add_argument("--topic", default="trajectories", help="logical source topic (default: trajectories)")
    p.add_argument("--from-offset", action="append", metavar="N|P:N", help="first offset (all partitions, or per partition)")
    p.add_argument("--to-offset", action="append", metavar="N|P:N", help="end offset, exclusive")
    p.add_argument("--since", help="record time >= (unix ms, ISO 8601, or relative like -15m)")
    p.add_argument("--until", help="record time < (same forms)")
    p.add_argument("--task", action="append", default=[], help="keep only these task ids (repeatable)")
    p.add_argument("--min-reward", type=float)
    p.add_argument("--max-reward", type=float)
    p.add_argument("--min-version", type=int, help="keep trajectories whose tokens all come from >= this policy version")
    p.add_argument("--max-version", type=int)
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--to-topic", help="full name of the destination topic (created if missing)")
    dest.add_argument("--to-dir", help="write msgpack files + index.jsonl into this folder")
    dest.add_argument("--to-learner", metavar="PREFIX",
                      help="copy into PREFIX+'trajectories' so `kernelrl --set bus.topic_prefix=PREFIX learner` "
                           "trains on them with its own group, checkpoints and weights")
    p.add_argument("--no-progress", action="store_true")


def run(args, cfg) -> int:
    from cluster.bus.client import Bus
    from cluster.bus.replay import DirSink, Selection, TopicSink, parse_offsets, parse_time, replay
    from cluster.bus.topics_admin import create_copy

    sel = Selection(topic=args.topic, from_offset=parse_offsets(args.from_offset), to_offset=parse_offsets(args.to_offset),
                    since_ms=parse_time(args.since) if args.since else None,
                    until_ms=parse_time(args.until) if args.until else None, task_ids=tuple(args.task),
                    min_reward=args.min_reward, max_reward=args.max_reward,
                    min_version=args.min_version, max_version=args.max_version)
    with Bus(cfg, client_id="kernelrl-replay") as bus:
        if args.to_dir:
            sink = DirSink(args.to_dir)
        else:
            dest = args.to_topic or f"{args.to_learner}trajectories"
            create_copy(cfg, bus.topic(args.topic), dest, bus.bootstrap)
            sink = TopicSink(bus, dest)
        result = replay(bus, sel, sink, progress=not args.no_progress)
    if args.to_learner:
        result["learner_command"] = f"kernelrl --set bus.topic_prefix={args.to_learner} learner"
    print(json.dumps(result, indent=2))
    return 0
