"""`kernelrl broker fetch|start|stop|status`: manage the embedded Kafka broker."""
from __future__ import annotations

from cluster.json_stdout import emit


def add_arguments(p) -> None:
    p.add_argument("action", choices=["fetch", "start", "stop", "status"])
    p.add_argument("--json", action="store_true", help="print the state as JSON")
    p.add_argument("--timeout", type=float, default=30.0, help="stop: seconds to wait before SIGKILL")
    p.add_argument("--nodes", type=int, default=1,
                   help="start/stop/status a replicated cluster of N KRaft nodes on loopback (tests, drills); "
                        "point bus.bootstrap_servers at its bootstrap and set topics.replication_factor=3")
    p.add_argument("--mirror", action="store_true",
                   help="fetch: also fetch MirrorMaker 2 (connect-mirror, same Kafka version) for two clusters")


def _show(args, data: dict, line: str) -> None:
    if args.json:
        emit(data, indent=2)
    else:
        print(line)


def run(args, cfg) -> int:
    from cluster.broker import embedded as broker

    if args.action == "fetch":
        libs = broker.fetch(cfg)
        data = {"libs": str(libs), "version": cfg.broker.kafka_version}
        line = f"Kafka {cfg.broker.kafka_version} jars in {libs}"
        if getattr(args, "mirror", False):
            from cluster.broker.fetch import fetch_mirror

            data["mirror_libs"] = str(fetch_mirror(cfg))
            line += f"; MirrorMaker 2 jars in {data['mirror_libs']}"
        _show(args, data, line)
        return 0
    if args.nodes > 1:
        return _cluster(args, cfg)
    if args.action == "start":
        st = broker.start(cfg)
        _show(args, st, f"Kafka {st.get('version')} running at {st.get('bootstrap')} "
                        f"(pid {st.get('pid')}, state {st['state_dir']})")
        return 0
    if args.action == "stop":
        res = broker.stop(cfg, timeout_s=args.timeout)
        if res["was_running"]:
            how = "cleanly" if res["clean"] else "after SIGKILL"
            _show(args, res, f"Kafka (pid {res['pid']}) stopped {how}")
        else:
            _show(args, res, "Kafka was not running")
        return 0
    st = broker.status(cfg)
    if cfg.bus.bootstrap_servers:
        st["external_bootstrap"] = cfg.bus.bootstrap_servers
    if st["running"]:
        line = (f"running: Kafka {st.get('version')} at {st.get('bootstrap')} (pid {st.get('pid')}, "
                f"{'reachable' if st['reachable'] else 'NOT reachable'}, state {st['state_dir']})")
    else:
        line = f"stopped (state {st['state_dir']})"
    if cfg.bus.bootstrap_servers:
        line += f"; roles use bus.bootstrap_servers={cfg.bus.bootstrap_servers}"
    _show(args, st, line)
    return 0 if st["running"] else 3


def _cluster(args, cfg) -> int:
    from cluster.broker import nodes as broker_cluster

    if args.action == "fetch":
        args.nodes = 1
        return run(args, cfg)
    if args.action == "start":
        st = broker_cluster.start(cfg, nodes=args.nodes)
        _show(args, st, f"Kafka cluster of {len(st['nodes'])} nodes at {st['bootstrap']} (state {st['state_dir']})")
        return 0
    if args.action == "stop":
        res = broker_cluster.stop(cfg, timeout_s=args.timeout)
        _show(args, res, f"stopped nodes {res['nodes']} {'cleanly' if res['clean'] else '(some after SIGKILL)'}")
        return 0
    st = broker_cluster.status(cfg)
    nodes = st.get("nodes", [])
    _show(args, st, f"{st['alive']} of {len(nodes)} nodes running at {st.get('bootstrap', '-')}: "
                    + ", ".join(f"n{n['id']} {'up' if n['running'] else 'DOWN'}" for n in nodes))
    return 0 if nodes and st["alive"] == len(nodes) else 3
