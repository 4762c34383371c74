"""Where the embedded broker's state lives and what it says: paths, the state file, liveness, bootstrap.

Split from cluster/broker/embedded.py (which starts and stops the broker) so that the clients' settings
(cluster/bus/clients.py) can find a running broker without importing the code that starts one.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from cluster.errors import RetriableError

_MAIN_CLASS = "kafka.Kafka"


# ----------------------------------------------------------------------------- paths

def state_dir(cfg) -> Path:
    d = cfg.broker.state_dir or str(Path(cfg.broker.cache_dir).expanduser() / "broker-state")
    return Path(d).expanduser()


def _state_file(cfg) -> Path:
    return state_dir(cfg) / "state.json"


# ----------------------------------------------------------------------------- state

def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_json(path: Path, state: dict) -> None:
    """Atomically: a reader never sees half a state file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (server.properties may hold the SASL password)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(text)


def read_state(cfg) -> dict:
    return read_json(_state_file(cfg))


def _write_state(cfg, state: dict) -> None:
    write_json(_state_file(cfg), state)


def pid_alive(pid: int | None) -> bool:
    """True when ``pid`` is a live (non-zombie) Kafka JVM."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return _MAIN_CLASS.encode() in cmdline


def status(cfg) -> dict:
    """The state file plus ``running`` (pid alive) and ``reachable`` (port accepts)."""
    st = read_state(cfg)
    st["state_dir"] = str(state_dir(cfg))
    st["running"] = pid_alive(st.get("pid"))
    st["reachable"] = bool(st["running"] and _port_open(client_host(cfg), st.get("port", 0)))
    return st


def client_host(cfg) -> str:
    """The address clients connect to: broker.advertised_host, else the bound broker.host."""
    return cfg.broker.advertised_host or cfg.broker.host


def bootstrap_servers(cfg) -> str:
    """Where clients connect: bus.bootstrap_servers, else the running embedded broker."""
    if cfg.bus.bootstrap_servers:
        return cfg.bus.bootstrap_servers
    st = status(cfg)
    if not st["running"]:
        raise RetriableError(
            f"no Kafka broker: the embedded one (state dir {st['state_dir']}) is not running. "
            "Start it with `kernelrl broker start`, or set bus.bootstrap_servers "
            "(KRL__BUS__BOOTSTRAP_SERVERS) to use an existing cluster.")
    return st["bootstrap"]


def _port_open(host: str, port: int) -> bool:
    if not port:
        return False
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
