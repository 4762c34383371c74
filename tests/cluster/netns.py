"""Network namespaces as machines: one "node" per namespace on a private subnet, joined by a bridge.

``Nodes(["broker", "a", "b"])`` makes a switch namespace holding a bridge and one namespace per node, each
with one veth port (``eth0``) on the bridge and the address ``<subnet>.<i>``. Each node's loopback device is up
(a machine reaches its own address through it) but holds no address: anything that talks to 127.0.0.1 or ::1
fails instead of passing by accident. Names carry this
process's pid: parallel runs never collide, and namespaces left by a killed run are removed by the next.
Needs root and iproute2 (``ip netns``).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

log = logging.getLogger(__name__)

_PREFIX = "krlnet"
_OWNED = re.compile(rf"^{_PREFIX}(\d+)x")


def missing_capability() -> str:
    """Why namespaces cannot be made here ("" when they can)."""
    if os.geteuid() != 0:
        return f"network namespaces need root; running as uid {os.geteuid()}"
    if not shutil.which("ip"):
        return "network namespaces need iproute2's `ip` (apt-get install iproute2)"
    return ""


def _ip(*args: str) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete namespaces this helper made in processes that are gone (a killed test run)."""
    gone = []
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _OWNED.match(name)
        if m and not _pid_alive(int(m[1])):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
            gone.append(name)
    return gone


class Nodes:
    """Namespaces ``names`` on ``subnet``.0/24 (addresses .1, .2, ... in order); ``close()`` removes them."""

    def __init__(self, names: list[str], subnet: str = "10.77.0") -> None:
        self.tag = f"{_PREFIX}{os.getpid()}x{os.urandom(2).hex()}"
        self.switch = f"{self.tag}-sw"
        self.ns = {n: f"{self.tag}-{n}" for n in names}
        self.addr = {n: f"{subnet}.{i}" for i, n in enumerate(names, start=1)}
        self._made: list[str] = []
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _add_ns(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)

    def _build(self) -> None:
        self._add_ns(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, (node, ns) in enumerate(self.ns.items()):
            self._add_ns(ns)
            port = f"p{i}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[node]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            self._strip_loopback(ns)
        log.info("nodes %s on a bridge in %s", self.addr, self.switch)

    @staticmethod
    def _strip_loopback(ns: str) -> None:
        _ip("-n", ns, "link", "set", "lo", "up")  # adds 127.0.0.1/8 and ::1 ...
        _ip("-n", ns, "addr", "del", "127.0.0.1/8", "dev", "lo")  # ... which no role may rely on
        subprocess.run(["ip", "-n", ns, "-6", "addr", "del", "::1/128", "dev", "lo"], capture_output=True,
                       check=False)  # absent where IPv6 is off

    def run_in(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` as a command that runs inside ``node``'s namespace."""
        return ["ip", "netns", "exec", self.ns[node], *argv]

    def sockets(self, node: str, state: str) -> list[tuple[str, str]]:
        """TCP sockets in ``node`` (``ss`` state "listening" or "established"): (local, peer) address pairs."""
        out = subprocess.run(self.run_in(node, ["ss", "-Htn", "state", state]), capture_output=True,
                             text=True, check=True).stdout
        rows = [line.split() for line in out.splitlines() if line.strip()]
        return [(r[-2], r[-1]) for r in rows]

    def loopback_addresses(self, node: str) -> list[str]:
        return _ip("-n", self.ns[node], "-br", "addr", "show", "dev", "lo").split()[2:]

    def close(self) -> None:
        for name in reversed(self._made):  # deleting a namespace deletes its veth end, and so the pair
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
        self._made.clear()
