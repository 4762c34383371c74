"""A single-process learner opens no socket on another interface: DeepSpeed's rendezvous (torch's TCPStore
on MASTER_PORT) listened on every interface whatever MASTER_ADDR said; one process now needs no TCP
rendezvous at all."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import cfg_env

CHILD = r"""
import json
from cluster.config import load
from learner import engine
engine.setup_env(load())
engine.init_distributed()
from tests.sockets import listening_sockets
out = listening_sockets()
print(json.dumps(out))
"""


def test_single_process_learner_listens_on_loopback_only(cfg):
    p = subprocess.run([sys.executable, "-c", CHILD], env=cfg_env(cfg), capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])  # the repository root: `tests` imports
    assert p.returncode == 0, p.stderr[-3000:]
    sockets = json.loads(p.stdout.strip().splitlines()[-1])
    assert all(addr in ("127.0.0.1", "::1") for addr, _ in sockets), sockets
