"""The embedded single-node Apache Kafka (KRaft): start, stop, status (jars: cluster.broker.fetch).

Jars come from Maven Central once (cluster/broker/fetch.py) into
``<cache_dir>/kafka-<version>/libs``. Each broker lives in a state dir holding its
``server.properties``, data (``data/``), log (``broker.log``) and ``state.json``
(pid, ports, bootstrap address, version): ``Bus(cfg)``, ``status`` and ``stop`` read it.
The broker listens on ``broker.host`` only (loopback by default; "0.0.0.0" = every interface) and tells
clients to connect to ``broker.advertised_host`` (default: ``broker.host``), also the address the
controller and the readiness check use, so no part of it assumes loopback; its ports are chosen free at the first
start and reused on later starts of the same state dir, so clients survive a restart. By default any
client that reaches the port may do anything; ``broker.auth = "sasl"`` turns on the authenticated listener:
SASL PLAIN on every listener (the controller's too), the StandardAuthorizer with no access without an
ACL, and one account, ``bus.sasl_username`` / ``bus.sasl_password``, a super user for kernelrl's roles.
"""
from __future__ import annotations

import base64
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from cluster.broker.fetch import _require, fetch, fetched, kafka_home  # noqa: F401 (re-exported)
from cluster.broker.state import (_MAIN_CLASS, _port_open, _state_file, _write_state,  # noqa: F401 (re-exported)
                                  bootstrap_servers, client_host, pid_alive, read_json, read_state, state_dir, status,
                                  write_json, write_private)
from cluster.launch.procs import die_with_parent
from cluster.errors import RetriableError, SetupError

log = logging.getLogger(__name__)

_LOG4J2 = """status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = INFO
"""


# ----------------------------------------------------------------------------- start

def free_port(host: str, avoid: set[int]) -> int:
    """A port free on ``host`` now and not in ``avoid``. The probe socket closes before its user binds the
    port, so the kernel may offer it again to the next probe: callers pass the ports they have handed out."""
    while True:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _pick_ports(cfg, previous: dict) -> tuple[int, int]:
    host = cfg.broker.host
    port = cfg.broker.port or previous.get("port") or 0
    cport = previous.get("controller_port") or 0
    if port and not _port_free(host, port):
        if cfg.broker.port:
            raise SetupError(f"broker.port: {port} on {host} is already in use")
        port = 0
    port = port or free_port(host, set())
    if not cport or cport == port or not _port_free(host, cport):
        cport = free_port(host, {port})
    return port, cport


def _max_message_bytes(cfg) -> int:
    return max(cfg.bus.max_message_bytes, cfg.topics.trajectory_max_message_bytes,
               cfg.topics.weights_max_message_bytes) + 1024 * 1024


_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def _auth_properties(cfg, listener: str) -> dict:
    """``broker.auth = "sasl"``: SASL PLAIN on the clients' and the controller's listener alike (brokers and
    controllers log in with the same account), no access without an ACL, ``bus.sasl_username`` a super user.
    config.validate keeps quotes, backslashes and line breaks out of the credentials (they go inline here)."""
    user, password = cfg.bus.sasl_username, cfg.bus.sasl_password
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            f'username="{user}" password="{password}" user_{user}="{password}";')
    return {
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        f"listener.name.{listener.lower()}.plain.sasl.jaas.config": jaas,
        "listener.name.controller.plain.sasl.jaas.config": jaas,
        "authorizer.class.name": _AUTHORIZER,
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{user}",
    }


def server_properties(cfg, data_dir: Path, port: int, cport: int, node_id: int = 1, voters: str = "",
                      replicas: int = 1) -> str:
    """One KRaft node (broker and controller); ``voters`` lists the quorum of a multi-node cluster, whose
    internal topics get ``replicas`` copies with at least 2 in sync. Every listener binds ``broker.host``; clients
    and the controller quorum reach the node at ``broker.advertised_host`` (default: ``broker.host``)."""
    host, advertised = cfg.broker.host, client_host(cfg)
    max_bytes = _max_message_bytes(cfg)
    isr = 2 if replicas >= 3 else 1
    sasl = cfg.broker.auth == "sasl"
    name = "SASL_PLAINTEXT" if sasl else "PLAINTEXT"  # the clients' (and inter-broker) listener
    props = {
        "process.roles": "broker,controller",
        "node.id": node_id,
        "controller.quorum.voters": voters or f"{node_id}@{advertised}:{cport}",
        "listeners": f"{name}://{host}:{port},CONTROLLER://{host}:{cport}",
        "advertised.listeners": f"{name}://{advertised}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": name,
        "listener.security.protocol.map": f"CONTROLLER:{name},{name}:{name}",
        "log.dirs": str(data_dir),
        "num.network.threads": 2,
        "num.io.threads": 4,
        "num.partitions": 1,
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 8,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": isr,
        "default.replication.factor": replicas,
        "min.insync.replicas": isr,
        "unclean.leader.election.enable": "false",
        "group.initial.rebalance.delay.ms": 0,
        "group.min.session.timeout.ms": 500,
        "message.max.bytes": max_bytes,
        "replica.fetch.max.bytes": max_bytes,
        "socket.request.max.bytes": max(104857600, 2 * max_bytes),
        "log.segment.bytes": 256 * 1024 * 1024,
        "log.retention.check.interval.ms": 300000,
        "delete.topic.enable": "true",
    }
    if sasl:
        props.update(_auth_properties(cfg, name))
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _java_cmd(cfg, java: str, libs: Path, sdir: Path, main: list[str]) -> list[str]:
    heap = cfg.broker.heap_mb
    jit_gc = (["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"] if cfg.broker.fast_start
              else ["-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20"])
    return [java, f"-Xms{min(heap, 256)}m", f"-Xmx{heap}m", *jit_gc,
            "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError",
            f"-Dlog4j2.configurationFile={sdir / 'log4j2.properties'}",
            "-cp", str(libs / "*"), *main]


def _cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _format_args(cluster_id: str, props: Path) -> list[str]:
    # `--cluster-id=ID`, not `-t ID`: one id in 64 starts with '-', which argparse reads as an option
    return ["kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}", "-c", str(props), "--ignore-formatted"]


def _format(cfg, java: str, libs: Path, sdir: Path, props: Path, data_dir: Path) -> None:
    if (data_dir / "meta.properties").is_file():
        return
    cmd = _java_cmd(cfg, java, libs, sdir, _format_args(_cluster_id(), props))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SetupError(f"formatting Kafka storage in {data_dir} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def _wait_ready(cfg, proc: subprocess.Popen, port: int, deadline: float, logfile: Path) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(f"Kafka exited with code {proc.returncode} during start; "
                             f"last log lines:\n{_tail(logfile)}")
        if _port_open(client_host(cfg), port) and _api_ready(client_host(cfg), port, cfg):
            return
        time.sleep(0.2)
    raise RetriableError(f"Kafka did not become ready within {cfg.broker.start_timeout_s}s; "
                         f"last log lines:\n{_tail(logfile)}")


def _api_ready(host: str, port: int, cfg) -> bool:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from cluster.bus.clients import connection_kwargs

    try:  # as the roles will connect (broker.auth = "sasl": with kernelrl's account)
        admin = KafkaAdminClient(request_timeout_ms=3000,
                                 **connection_kwargs(cfg, "kernelrl-readiness", f"{host}:{port}"))
    except KafkaError:
        return False
    try:
        admin.describe_cluster()
        return True
    except KafkaError:
        return False
    finally:
        admin.close()


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


_CHILDREN: dict[int, subprocess.Popen] = {}  # brokers started by this process: reaped on stop


def start(cfg, tie_to_parent: bool = False) -> dict:
    """Start the broker (daemonized) unless it runs already; wait until it serves requests.

    ``tie_to_parent``: the broker gets SIGTERM when this process dies, even by SIGKILL
    (test sessions, benchmarks, `kernelrl up`); the CLI's `broker start` leaves it running.
    """
    st = status(cfg)
    if st["running"]:
        return st
    java = _require("java", "Java 17+")
    libs = fetch(cfg)
    sdir = state_dir(cfg)
    data_dir = sdir / "data"
    sdir.mkdir(parents=True, exist_ok=True)
    port, cport = _pick_ports(cfg, st)
    props = sdir / "server.properties"
    write_private(props, server_properties(cfg, data_dir, port, cport))
    (sdir / "log4j2.properties").write_text(_LOG4J2.format(level="WARN"))
    _format(cfg, java, libs, sdir, props, data_dir)
    logfile = sdir / "broker.log"
    cmd = _java_cmd(cfg, java, libs, sdir, [_MAIN_CLASS, str(props)])
    with open(logfile, "ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(cmd, stdin=devnull, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=sdir,
                                preexec_fn=die_with_parent if tie_to_parent else None)
    _CHILDREN[proc.pid] = proc
    state = {"pid": proc.pid, "port": port, "controller_port": cport, "host": cfg.broker.host,
             "advertised_host": client_host(cfg), "bootstrap": f"{client_host(cfg)}:{port}", "version": cfg.broker.kafka_version,
             "auth": cfg.broker.auth, "started_at": time.time()}
    _write_state(cfg, state)
    try:
        _wait_ready(cfg, proc, port, time.monotonic() + cfg.broker.start_timeout_s, logfile)
    except BaseException:  # Ctrl-C included: never leave a half-started JVM behind
        _terminate(proc.pid, 10.0)
        raise
    log.info("Kafka %s ready at %s (pid %d)", cfg.broker.kafka_version, state["bootstrap"], proc.pid)
    return status(cfg)


# ----------------------------------------------------------------------------- stop

def _gone(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        _CHILDREN.pop(pid, None)
        return True
    return not pid_alive(pid)


def _terminate(pid: int, timeout_s: float) -> bool:
    """SIGTERM the broker's process group, wait, SIGKILL if needed. True if it exited cleanly."""
    clean = True
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if _gone(pid):
                return clean
            time.sleep(0.1)
        clean = False
        log.warning("Kafka pid %d ignored %s for %.0fs", pid, sig.name, wait_s)
    return _gone(pid)


def stop(cfg, timeout_s: float = 30.0) -> dict:
    """Stop the broker: SIGTERM (controlled shutdown), then SIGKILL after ``timeout_s``."""
    st = read_state(cfg)
    pid = st.get("pid")
    result = {"was_running": pid_alive(pid), "pid": pid, "clean": True}
    if result["was_running"]:
        result["clean"] = _terminate(pid, timeout_s)
    if st:
        st["pid"] = None
        st["stopped_at"] = time.time()
        _write_state(cfg, st)
    return result
