"""A single-process learner opens no socket on another interface: DeepSpeed's rendezvous (torch's TCPStore
on MASTER_PORT) listened on every interface whatever MASTER_ADDR said; one process now needs no TCP
rendezvous at all."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import cfg_env

CHILD = r"""
import json, os
from cluster.config import load
from learner import engine
engine.setup_env(load())
engine.init_distributed()
pid, inodes = os.getpid(), set()
for fd in os.listdir(f"/proc/{pid}/fd"):
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:["):
        inodes.add(link[8:-1])
out = []
for name in ("tcp", "tcp6"):
    for line in open(f"/proc/net/{name}").read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # 0A = LISTEN, and the socket is this process's
            out.append([name, f[1]])
print(json.dumps(out))
"""


def _loopback(name: str, local: str) -> bool:
    addr = local.split(":")[0]
    return addr == "0100007F" if name == "tcp" else addr == "0" * 24 + "01000000"


def test_single_process_learner_listens_on_loopback_only(cfg):
    p = subprocess.run([sys.executable, "-c", CHILD], env=cfg_env(cfg), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    sockets = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(_loopback(n, local) for n, local in sockets), sockets
