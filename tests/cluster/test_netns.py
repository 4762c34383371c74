"""The multi-node layout on one machine: roles on three "machines" (network namespaces on a bridge, no loopback
address in any) reach each other only by node addresses. The embedded broker (node "broker") binds every
interface and announces its node address; a compile worker and a weight publisher run on node "a"; clients
on node "b" send real work, scrape the worker's metrics with prometheus_client's parser and receive
weight versions over the ``kafka`` and ``nccl`` (gloo) transports, bit-identical and verified."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cluster import netns
from tests.conftest import KERNELRL, ROOT, TEST_OVERRIDES

NODES = ["broker", "a", "b"]
BROKER_PORT, METRICS_PORT = 9092, 9400  # each node has its own ports: no clash with anything on the host
PROBE = [KERNELRL[0], "-m", "tests.cluster.netns_probe"]
MODEL = "netns"


@pytest.fixture
def nodes():
    why = netns.missing_capability()
    if why:  # CI runs as root: a missing capability is a failure there, never a silent skip
        pytest.fail(f"the multi-node test needs network namespaces: {why}")
    netns.remove_stale()
    made = netns.Nodes(NODES)
    yield made
    made.close()


@pytest.fixture
def env(nodes, tmp_path):
    """The roles' environment: the broker by its node address, this run's topics, no setting of the host's."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KRL__") and k != "KERNELRL_METRICS_PORT"}
    settings = {**TEST_OVERRIDES, "bus.bootstrap_servers": f"{nodes.addr['broker']}:{BROKER_PORT}",
                "bus.topic_prefix": f"netns{os.getpid()}.", "sandbox.artifact_cache_dir": tmp_path / "artifacts",
                "broker.state_dir": tmp_path / "broker"}
    return {**base, "PYTHONPATH": str(ROOT),
            **{"KRL__" + k.upper().replace(".", "__"): str(v) for k, v in settings.items()}}


@pytest.fixture
def embedded_broker(nodes, env, tmp_path):
    """The embedded broker on node "broker": binds 0.0.0.0, announces the node's address."""
    from cluster.broker import embedded as broker
    from cluster.config import Config

    cfg = Config()
    cfg.broker.state_dir = env["KRL__BROKER__STATE_DIR"]
    try:
        yield _run(nodes, "broker", KERNELRL + [
            "--set", "broker.host=0.0.0.0", "--set", f"broker.advertised_host={nodes.addr['broker']}",
            "--set", f"broker.port={BROKER_PORT}", "broker", "start", "--json"], env, timeout=180)
    finally:
        broker.stop(cfg, timeout_s=10)


def _run(nodes, node: str, argv: list[str], env: dict, timeout: float = 120) -> dict:
    """Run ``argv`` on ``node``; its stdout (or that's last line) parsed as JSON."""
    proc = subprocess.run(nodes.run_in(node, argv), env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"on {node}: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return json.loads(proc.stdout.strip().splitlines()[-1])


def _host(address: str) -> str:
    """The host of an ``ss`` address ("10.77.0.1:9092", "[::ffff:10.77.0.1]:4000", "*:22"), IPv4-mapped unwrapped."""
    return address.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")


def _weights_folder(tmp_path: Path) -> Path:
    d = tmp_path / "policy"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    (d / "config.json").write_text('{"model_type": "qwen2"}')
    return d


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _push_kafka(nodes, env, src: Path, tmp_path: Path) -> None:
    pushed = _run(nodes, "a", KERNELRL + ["weights", "push", "--transport", "kafka", "--path", str(src),
                                          "--model-name", MODEL], env)
    got = _run(nodes, "b", PROBE + ["receive", MODEL, str(pushed["version"]), str(tmp_path / "recv-kafka")], env)
    assert got["transport"] == "kafka" and got["files"] == _hashes(src)


def _push_nccl(nodes, env, src: Path, tmp_path: Path, spawn) -> list[tuple[str, str]]:
    """A version served from node "a" over gloo, received on "b"; the publisher's listening sockets."""
    addr = nodes.addr["a"]
    server = spawn(nodes.run_in("a", KERNELRL + [
        "--set", f"learner.weight_stream_host={addr}", "--set", "learner.weight_stream_backend=gloo",
        "--set", f"learner.weight_fs_dir={tmp_path / 'served'}", "weights", "push", "--transport", "nccl",
        "--path", str(src), "--model-name", MODEL, "--serve-s", "120"]),
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = server.stdout.readline()
    assert line, f"the nccl publisher printed nothing:\n{server.stderr.read()[-3000:]}"
    pushed = json.loads(line)
    got = _run(nodes, "b", PROBE + ["receive", MODEL, str(pushed["version"]), str(tmp_path / "recv-nccl")], env)
    assert got["transport"] == "nccl" and got["uri"].startswith(f"nccl://{addr}:"), got
    assert got["files"] == _hashes(src)
    listening = nodes.sockets("a", "listening")
    server.send_signal(signal.SIGTERM)
    _, err = server.communicate(timeout=60)
    assert "served 1 transfers (0 failed)" in err, err[-3000:]
    return listening


def test_roles_on_separate_nodes_share_work_metrics_and_weights(nodes, env, embedded_broker, spawn, tmp_path):
    broker_addr, a_addr = nodes.addr["broker"], nodes.addr["a"]
    assert embedded_broker["bootstrap"] == f"{broker_addr}:{BROKER_PORT}"
    # what clients on another node are told to connect to: the node address, never loopback
    assert _run(nodes, "b", PROBE + ["metadata"], env)["brokers"] == [{"host": broker_addr, "port": BROKER_PORT}]

    worker_env = {**env, "KERNELRL_METRICS_PORT": str(METRICS_PORT), "KRL__CLUSTER__METRICS_HOST": a_addr}
    with open(tmp_path / "compile-worker.log", "wb") as log:
        worker = spawn(nodes.run_in("a", KERNELRL + ["-v", "compile-worker"]), env=worker_env, stdout=log,
                       stderr=log)

    src = _weights_folder(tmp_path)
    _push_kafka(nodes, env, src, tmp_path)  # also creates the run's topics, while the worker starts
    listening = _push_nccl(nodes, env, src, tmp_path, spawn)

    done = _run(nodes, "b", PROBE + ["compile"], env, timeout=300)  # real work: a build in the sandbox on "a"
    assert done["ok"] and not done["cached"] and done["artifact_key"], done
    assert worker.poll() is None, (tmp_path / "compile-worker.log").read_text()[-3000:]
    metrics = _run(nodes, "b", PROBE + ["scrape", f"http://{a_addr}:{METRICS_PORT}/metrics"], env)
    assert metrics["kernelrl_jobs_done_total"] >= 1, sorted(metrics)

    listening += nodes.sockets("a", "listening") + nodes.sockets("broker", "listening")
    assert {_host(local) for local, _ in listening} <= {"0.0.0.0", "*", "::", broker_addr, a_addr}, listening
    assert f"{a_addr}:{METRICS_PORT}" in {local for local, _ in nodes.sockets("a", "listening")}
    peers = {peer for node in NODES for _, peer in nodes.sockets(node, "established")}
    assert f"{broker_addr}:{BROKER_PORT}" in peers and {_host(p) for p in peers} <= set(nodes.addr.values()), peers
    assert not any(nodes.loopback_addresses(n) for n in NODES)  # so nothing above could have used loopback


def test_broker_binds_every_interface_only_when_it_announces_an_address(tmp_path):
    from cluster.broker.embedded import server_properties
    from cluster.config import ConfigError, load

    with pytest.raises(ConfigError, match=r"broker.host: .*advertised_host.*'0.0.0.0'"):
        load(overrides=["broker.host=0.0.0.0"], environ={})
    with pytest.raises(ConfigError, match=r"broker.advertised_host: .*got '0.0.0.0'"):
        load(overrides=["broker.host=0.0.0.0", "broker.advertised_host=0.0.0.0"], environ={})
    cfg = load(overrides=["broker.host=0.0.0.0", "broker.advertised_host=kafka-0.kafka"], environ={})
    props = dict(line.split("=", 1) for line in server_properties(cfg, tmp_path, 9092, 9093).splitlines())
    assert props["listeners"] == "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093"
    assert props["advertised.listeners"] == "PLAINTEXT://kafka-0.kafka:9092"
    assert props["controller.quorum.voters"] == "1@kafka-0.kafka:9093"
