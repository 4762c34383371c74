"""`kernelrl bench weights receivers=N`: the "nccl" transport's one-to-many broadcast against serving the same N
receivers one after another (what it did before the broadcast), measured in the same run on the same version.

Receivers are separate processes (as actors are, started and imported before the clock), each materialising and
verifying the version in a folder of its own; ``together_s`` is from releasing all N at once to the last one done
(its own clock reading when its receive returned: the interpreter's exit is not timed; one group, after the
server's gather wait), ``one_by_one_s`` the sum over N receivers released after each other
(one group each, no gather wait). gloo on the CPU machine, NCCL between distinct GPUs.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)
MODEL_NAME = "bench-stream"


def _receive(ann, dest: str, ready, go, done) -> None:
    import torch.distributed  # noqa: F401 - as in a running actor, whose engine imported it long before

    from cluster.weights import transport as wt  # imported (torch too) before the clock starts, as in a running actor

    ready.release()
    go.wait(600)
    wt.receive(None, ann, dest, timeout_s=600)
    done.put(time.perf_counter())  # CLOCK_MONOTONIC, one clock for every process: the interpreter's exit is not timed


def _run(ctx, ann, dests: list[Path]) -> float:
    """Seconds from releasing a ready receiver process per folder to the last one done (each must succeed)."""
    ready, go, done = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_receive, args=(ann, str(d), ready, go, done)) for d in dests]
    for p in procs:
        p.start()
    for _ in procs:
        if not ready.acquire(timeout=600):
            raise RuntimeError("stream bench: a receiver did not start")
    t0 = time.perf_counter()
    go.set()
    for p in procs:
        p.join(900)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"stream bench: a receiver failed (exit codes {[p.exitcode for p in procs]})")
    return max(done.get(timeout=10) for _ in procs) - t0


def receive_one(ann, dest: Path) -> float:
    """Seconds for one receiver process (started and imported before the clock, as a running actor) to
    materialise and verify the announced stream version in ``dest``."""
    return _run(mp.get_context("spawn"), ann, [dest])


def run_fanout(folder: Path, receivers: int, tmp: Path, chunk_bytes: int, backend: str = "auto") -> dict:
    """One version of ``folder`` served to ``receivers`` processes together, then one at a time."""
    from cluster.weights import fs as wfs
    from cluster.weights import stream as ws

    ctx = mp.get_context("spawn")  # a clean interpreter per receiver: no inherited torch threads or groups
    nbytes = sum(p.stat().st_size for p in wfs.version_files(Path(folder)))
    server = ws.WeightStreamServer(tmp / "served", backend=backend, chunk_bytes=chunk_bytes, timeout_s=600,
                                   gather_s=1.0)
    try:
        ann = server.add(MODEL_NAME, 1, folder)
        together = _run(ctx, ann, [tmp / f"together-{i}" for i in range(receivers)])
        groups_together = list(server.groups)
        server.gather_s = 0.0
        one_by_one = sum(_run(ctx, ann, [tmp / f"single-{i}"]) for i in range(receivers))
    finally:
        server.close()
        for d in tmp.glob("together-*"):
            shutil.rmtree(d, ignore_errors=True)
        for d in tmp.glob("single-*"):
            shutil.rmtree(d, ignore_errors=True)
    return {"receivers": receivers, "bytes": nbytes, "backend": ws.resolve_backend(backend),
            "groups_together": groups_together, "together_s": round(together, 3), "one_by_one_s": round(one_by_one, 3),
            "together_gb_s": round(nbytes * receivers / together / 1e9, 4),
            "one_by_one_gb_s": round(nbytes * receivers / one_by_one / 1e9, 4),
            "speedup": round(one_by_one / together, 3)}
