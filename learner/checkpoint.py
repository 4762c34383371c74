"""Learner checkpoints: DeepSpeed state of both engines plus the learner's own state, committed atomically.

Layout under the checkpoint dir: ``policy/<tag>/`` and ``critic/<tag>/`` (DeepSpeed:
module, optimizer, ZeRO partitions) and ``STATE.json``, which names the tag and
holds the learner state (step, stage, policy version, consumed Kafka positions,
episode ids already seen). ``STATE.json`` is replaced by rename only after every
rank finished writing, so it is the commit point: a crash before it leaves the
previous checkpoint in force.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from learner import engine as eng

log = logging.getLogger(__name__)

STATE = "STATE.json"


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def read_state(ckpt_dir: str | os.PathLike) -> dict | None:
    p = Path(ckpt_dir) / STATE
    if not p.is_file():
        return None
    return json.loads(p.read_text())


def save(trainer, ckpt_dir: str | os.PathLike, step: int, state: dict, keep: int = 2) -> str:
    """Save both engines under a new tag, then commit STATE.json (rank 0). Every rank calls this."""
    ckpt_dir = Path(ckpt_dir)
    tag = tag_for(step)
    trainer.policy.save_checkpoint(str(ckpt_dir / "policy"), tag=tag, client_state={"step": step})
    trainer.critic.save_checkpoint(str(ckpt_dir / "critic"), tag=tag, client_state={"step": step})
    eng.barrier()
    rank, _ = eng.rank_world()
    if rank == 0:
        body = json.dumps({"tag": tag, "world": eng.rank_world()[1], **state})
        tmp = ckpt_dir / f".{STATE}.tmp"
        with open(tmp, "w") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, ckpt_dir / STATE)
        _prune(ckpt_dir, keep)
    eng.barrier()
    return tag


def _prune(ckpt_dir: Path, keep: int) -> None:
    for sub in ("policy", "critic"):
        tags = sorted(p for p in (ckpt_dir / sub).glob("step*") if p.is_dir())
        for old in tags[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)


def load(trainer, ckpt_dir: str | os.PathLike) -> dict | None:
    """Restore both engines from the committed tag; returns the learner state or None (fresh start)."""
    state = read_state(ckpt_dir)
    if state is None:
        return None
    tag = state["tag"]
    _, world = eng.rank_world()
    same_world = int(state.get("world", world)) == world
    if not same_world:
        # ZeRO's optimizer partitions are per rank: with another world size only the weights carry over.
        log.warning("checkpoint %s was written by %s ranks, this run has %d: loading weights only, the optimizer "
                    "state starts afresh", tag, state.get("world"), world)
    for name, engine in (("policy", trainer.policy), ("critic", trainer.critic)):
        path, _ = engine.load_checkpoint(str(Path(ckpt_dir) / name), tag=tag, load_optimizer_states=same_world,
                                         load_lr_scheduler_states=same_world, load_module_only=not same_world)
        if path is None:
            raise RuntimeError(f"checkpoint {ckpt_dir}/{name}/{tag} named by {STATE} could not be loaded")
    log.info("resumed from %s/%s (step %s, policy version %s)", ckpt_dir, tag, state.get("step"),
             state.get("policy_version"))
    return state
