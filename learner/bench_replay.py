"""`kernelrl bench learner trajectories=DIR stages=rft:2,ppo:4`: the learner's stages on recorded trajectories.

The learner part of `kernelrl bench learning`, for a machine with no broker and no vLLM (the GPU host):
the trajectories a run wrote (dumped with `kernelrl replay --to-dir DIR`, one msgpack record each) are trained
on with a stage schedule. Each step takes ``batch`` of the samples its stage accepts (learner/data.stage_rejects:
RFT only passing episodes without malformed or repeated actions, PPO only the policy's own tokens with
log-probs), in record order, cycling when they run out. The staleness bound does not apply (the versions are
the recorded ones). Per step: stage, seconds, tokens, tokens/s and the stage's losses; per stage the totals.

What it measures is the learner's speed on real trajectories (their lengths, masks and rewards). The weights
it starts from are the model given, not the ones that sampled the trajectories, so PPO's importance weights
and losses here say nothing about learning; the learning itself is `kernelrl bench learning`'s.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

log = logging.getLogger(__name__)

METRICS = ("loss", "policy_loss", "value_loss", "entropy", "clip_frac", "kl_behaviour", "is_masked_frac")


def load_samples(folder: str | Path, vocab_size: int = 0) -> tuple[list, Counter]:
    """The trainable samples of a replay folder, in record order, and how many records were skipped, by why."""
    from learner.data import InvalidTrajectory, from_trajectory
    from schemas.codec import SchemaError, decode
    from schemas.messages import REWARD_UNDETERMINED, Trajectory

    files = sorted(Path(folder).glob("*.msgpack"))
    if not files:
        from cluster.errors import InputError

        raise InputError(f"trajectories={folder}: no *.msgpack records (write them with `kernelrl replay "
                         "--to-dir`)")
    samples, skipped = [], Counter()
    for path in files:
        try:
            msg = decode(path.read_bytes(), expected=Trajectory)
            if msg.reward_status == REWARD_UNDETERMINED:
                skipped["undetermined"] += 1
                continue
            samples.append(from_trajectory(msg, vocab_size=vocab_size))
        except (SchemaError, InvalidTrajectory) as exc:
            log.warning("%s: skipped: %s", path.name, exc)
            skipped["invalid"] += 1
    return samples, skipped


def pick(samples: list, stage: str, batch: int, cursor: dict[str, int]) -> list:
    """The next ``batch`` samples ``stage`` trains on (cycling; fewer if fewer exist), advancing its cursor."""
    from learner.data import stage_rejects

    pool = [s for s in samples if not stage_rejects(s, stage)]
    if not pool:
        return []
    start = cursor.get(stage, 0)
    out = [pool[(start + j) % len(pool)] for j in range(min(batch, len(pool)))]
    cursor[stage] = start + len(out)
    return out


def run(cfg, model_path: str, folder: str, stages: str, batch: int) -> dict:
    import torch

    from cluster.errors import InputError
    from learner.stages import Schedule, parse
    from learner.trainer import Trainer

    schedule = Schedule(parse(stages, "stages"), cfg.learner.stage, cfg.learner.actor_lr)
    if not schedule.total_steps:
        raise InputError("stages: give a schedule, e.g. stages=rft:2,ppo:4")
    trainer = Trainer(cfg, model_path)
    samples, skipped = load_samples(folder, int(trainer.policy_module().config.vocab_size))
    cursor: dict[str, int] = {}
    steps = []
    for i in range(schedule.total_steps):
        plan = schedule.at(i)
        take = pick(samples, plan.stage, batch, cursor)
        if not take:
            raise InputError(f"stage {plan.stage}: none of the {len(samples)} recorded trajectories is one it "
                             "trains on")
        trainer.set_stage(plan.stage, schedule.lr_at(i))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        m = trainer.step(take)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        row = {"step": i + 1, "stage": plan.stage, "seconds": secs, "trajectories": len(take),
               "tokens": int(m["tokens"]), "tok_s": m["tokens"] / secs}
        row.update({k: float(m[k]) for k in METRICS if k in m})
        steps.append(row)
        log.info("step %d (%s): %.2f s, %d tokens", i + 1, plan.stage, secs, row["tokens"])
    per_stage: dict[str, dict] = {}
    for row in steps:
        agg = per_stage.setdefault(row["stage"], {"steps": 0, "seconds": 0.0, "tokens": 0})
        agg["steps"] += 1
        agg["seconds"] += row["seconds"]
        agg["tokens"] += row["tokens"]
    for agg in per_stage.values():
        agg["tok_s"] = agg["tokens"] / agg["seconds"]
    passing = sum(1 for s in samples if s.reward > 0)
    return {"trajectories": folder, "records": len(samples) + sum(skipped.values()), "samples": len(samples),
            "samples_passing": passing, "skipped": dict(skipped), "stages": stages, "batch": batch,
            "steps": steps, "per_stage": per_stage, "trainer": trainer}
