"""A weights receiver in its own process, as an actor would be: ``spawn`` / ``receive_in_child`` for tests.

Run as ``python -m tests.cluster.weights_receiver ANN_JSON DEST MODE``: mode "ok" receives normally and prints
the folder; "desert" takes a stream ticket and leaves; "die" SIGKILLs itself after the second chunk of a
stream, mid-transfer; "slow" prints STREAMING and pauses 2 s after the first chunk.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def spawn(ann, dest: Path, mode: str = "ok", **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.cluster.weights_receiver", json.dumps(ann.__dict__),
                             str(dest), mode], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def receive_in_child(ann, dest: Path, **env) -> Path:
    """The folder a child process materialised for ``ann`` (asserting it succeeded)."""
    proc = spawn(ann, dest, **env)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return Path(out.strip().splitlines()[-1])


def _desert(ann) -> None:
    import datetime

    import torch.distributed as dist

    from cluster.weights import stream as ws

    m = ws._URI.match(ann.uri)
    store = dist.TCPStore(m["host"], int(m["port"]), None, False, datetime.timedelta(seconds=10))
    n = store.add("tickets", 1)
    store.set(f"t{n}/want", f"{ann.model_name}:{ann.version}")
    os._exit(0)


def _hook_broadcast(mode: str) -> None:
    from cluster.weights import stream as ws

    real, calls = ws._broadcast, []

    def hooked(pg, t):
        calls.append(1)
        if len(calls) == 3 and mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if len(calls) == 2 and mode == "slow":
            print("STREAMING", flush=True)
            time.sleep(2.0)
        real(pg, t)

    ws._broadcast = hooked


def main() -> None:
    from cluster.weights import transport as wt
    from schemas.messages import WeightAnnouncement

    ann, dest, mode = WeightAnnouncement(**json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]
    if mode == "desert":
        _desert(ann)
    if mode in ("die", "slow"):
        _hook_broadcast(mode)
    print(wt.receive(None, ann, dest, timeout_s=60))


if __name__ == "__main__":
    main()
