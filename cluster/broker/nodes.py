"""A replicated Kafka cluster on one machine: N KRaft nodes (each broker and controller) on loopback ports.

`kernelrl broker start --nodes 3` runs it for tests and drills of broker loss: topics get 3 replicas with
at least 2 in sync (``topics.replication_factor = 3``), so an acknowledged record survives the loss of any
one node. It lives in ``<state dir>/cluster`` beside the single-node broker: a node folder each
(``n1``...: server.properties, data, node.log) and ``cluster.json`` (cluster id, and per node its id, pid
and ports). Ports and the cluster id are kept across starts, so ``start`` again brings back only the nodes
that died, on their own addresses and data.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cluster.broker import embedded as broker
from cluster.errors import RetriableError, SetupError
from cluster.launch.procs import die_with_parent

log = logging.getLogger(__name__)


def cluster_dir(cfg) -> Path:
    return broker.state_dir(cfg) / "cluster"


def _state_path(cfg) -> Path:
    return cluster_dir(cfg) / "cluster.json"


def read_state(cfg) -> dict:
    return broker.read_json(_state_path(cfg))


def _write_state(cfg, state: dict) -> None:
    broker.write_json(_state_path(cfg), state)


def status(cfg) -> dict:
    """cluster.json with ``running`` per node, ``alive`` (how many run) and ``bootstrap``."""
    st = read_state(cfg)
    for node in st.get("nodes", []):
        node["running"] = broker.pid_alive(node.get("pid"))
    st["alive"] = sum(1 for n in st.get("nodes", []) if n["running"])
    st["state_dir"] = str(cluster_dir(cfg))
    return st


def _ports(cfg, st: dict, nodes: int) -> list[tuple[int, int]]:
    old = [(n["port"], n["cport"]) for n in st.get("nodes", [])]
    if len(old) == nodes:
        return old
    if old:
        raise SetupError(f"{cluster_dir(cfg)} holds a {len(old)}-node cluster, not {nodes}: stop it and remove "
                         "the folder to change its size")
    taken: set[int] = set()
    out = []
    for _ in range(nodes):
        port = broker.free_port(cfg.broker.host, taken)
        taken.add(port)
        cport = broker.free_port(cfg.broker.host, taken)
        taken.add(cport)
        out.append((port, cport))
    return out


def start(cfg, nodes: int = 3, tie_to_parent: bool = False) -> dict:
    """Start every node that is not running (all of them the first time) and wait until each serves."""
    if nodes < 1:
        raise SetupError(f"--nodes: expected >= 1, got {nodes}")
    java = broker._require("java", "Java 17+")
    libs = broker.fetch(cfg)
    cdir = cluster_dir(cfg)
    cdir.mkdir(parents=True, exist_ok=True)
    st = status(cfg)
    ports = _ports(cfg, st, nodes)
    cluster_id = st.get("cluster_id") or broker._cluster_id()
    host = broker.client_host(cfg)  # what the quorum and clients connect to (broker.advertised_host)
    voters = ",".join(f"{i + 1}@{host}:{c}" for i, (_, c) in enumerate(ports))
    old = {n["id"]: n for n in st.get("nodes", [])}
    state = {"cluster_id": cluster_id, "version": cfg.broker.kafka_version, "host": host,
             "bootstrap": ",".join(f"{host}:{p}" for p, _ in ports), "nodes": []}
    started = []
    for i, (port, cport) in enumerate(ports, start=1):
        node = old.get(i, {"id": i, "port": port, "cport": cport, "pid": None})
        if not node.get("running"):
            node["pid"] = _start_node(cfg, java, libs, cdir / f"n{i}", i, port, cport, voters, nodes, cluster_id,
                                      tie_to_parent)
            node["started_at"] = time.time()
            started.append(node)
        state["nodes"].append({k: node[k] for k in ("id", "port", "cport", "pid")})
    _write_state(cfg, state)
    deadline = time.monotonic() + cfg.broker.start_timeout_s + 30.0
    with ThreadPoolExecutor(max_workers=max(1, len(started))) as pool:
        list(pool.map(lambda n: _wait_node(cfg, n, deadline), started))
    if started:
        log.info("Kafka cluster of %d nodes ready at %s (started %s)", nodes, state["bootstrap"],
                 [n["id"] for n in started])
    return status(cfg)


def _start_node(cfg, java, libs, ndir: Path, node_id: int, port: int, cport: int, voters: str, nodes: int,
                cluster_id: str, tie_to_parent: bool) -> int:
    ndir.mkdir(parents=True, exist_ok=True)
    data = ndir / "data"
    props = ndir / "server.properties"
    broker.write_private(props, broker.server_properties(cfg, data, port, cport, node_id=node_id, voters=voters,
                                                         replicas=min(3, nodes)))
    (ndir / "log4j2.properties").write_text(broker._LOG4J2.format(level="WARN"))
    if not (data / "meta.properties").is_file():
        cmd = broker._java_cmd(cfg, java, libs, ndir, broker._format_args(cluster_id, props))
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SetupError(f"formatting node {node_id} in {data} failed:\n{(out.stdout + out.stderr)[-3000:]}")
    if not broker._port_free(cfg.broker.host, port):
        raise RetriableError(f"node {node_id}: port {port} is still in use (a node that just died?); retry")
    with open(ndir / "node.log", "ab") as logf, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(broker._java_cmd(cfg, java, libs, ndir, [broker._MAIN_CLASS, str(props)]),
                                stdin=devnull, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=ndir, preexec_fn=die_with_parent if tie_to_parent else None)
    broker._CHILDREN[proc.pid] = proc
    return proc.pid


def _wait_node(cfg, node: dict, deadline: float) -> None:
    logfile = cluster_dir(cfg) / f"n{node['id']}" / "node.log"
    while time.monotonic() < deadline:
        if not broker.pid_alive(node["pid"]):
            raise SetupError(f"Kafka node {node['id']} exited during start; last log lines:\n"
                             f"{broker._tail(logfile)}")
        host = broker.client_host(cfg)
        if broker._port_open(host, node["port"]) and broker._api_ready(host, node["port"], cfg):
            return
        time.sleep(0.3)
    raise RetriableError(f"Kafka node {node['id']} did not serve in time; last log lines:\n{broker._tail(logfile)}")


def kill(cfg, node_id: int, sig: int = signal.SIGKILL) -> int:
    """Signal one node's JVM (drills); returns its pid."""
    node = next((n for n in status(cfg).get("nodes", []) if n["id"] == node_id), None)
    if node is None or not node["running"]:
        raise SetupError(f"node {node_id} is not running")
    os.kill(node["pid"], sig)
    return node["pid"]


def stop(cfg, timeout_s: float = 30.0) -> dict:
    """SIGTERM every node (controlled shutdown), SIGKILL what is left after ``timeout_s``."""
    st = status(cfg)
    res = {"nodes": [], "clean": True}
    running = [n for n in st.get("nodes", []) if n["running"]]
    with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
        clean = list(pool.map(lambda n: broker._terminate(n["pid"], timeout_s), running))
    res["nodes"] = [n["id"] for n in running]
    res["clean"] = all(clean)
    return res


def leaders(cfg, bootstrap: str, suffix: str) -> dict[str, dict[int, dict]]:
    """{topic: {partition: {"leader": id, "isr": [ids]}}} of the topics whose name ends with ``suffix``."""
    from kafka import KafkaAdminClient

    from cluster.bus.clients import admin_kwargs

    admin = KafkaAdminClient(**admin_kwargs(cfg, "kernelrl-leaders", bootstrap))
    try:
        names = [t for t in admin.list_topics() if t.endswith(suffix)]
        return {t["name"]: {p["partition_index"]: {"leader": p["leader_id"], "isr": sorted(p["isr_nodes"])}
                            for p in t["partitions"]} for t in admin.describe_topics(names)}
    finally:
        admin.close()
