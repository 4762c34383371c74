"""`kernelrl bench learning`: does the loop learn easy CPU kernels, and does it carry over to held-out tasks?

One `kernelrl up` run with a stage schedule (RFT on demonstrations, then PPO on the policy's own samples) on
a small set of easy CPU tasks (cluster/launch/bench_learning_tasks/train, each with a `<task>.solution/` replayed as
demonstrations), while the same actors, with the same current policy, also roll out a held-out set of
similar tasks (cluster/launch/bench_learning_tasks/heldout): those episodes are never trained on (the feeder marks
them `metadata.heldout`, the learner's stage filters drop them) and never demonstrated. After the learner's
last step the actors sample the final version for `--tail-s` seconds more. The curves are read back from the
run's report (trajectories and learner log on Kafka).

Before and after (the same rule for the training and the held-out tasks):
  before: the pass rate (reward > 0) of the policy's own episodes sampled with version 0 (the model as given);
  after:  those sampled with the last version that has episodes, pooled with earlier versions (newest first,
          never version 0, at most --after-versions of them) until --after-min-episodes training episodes
          are pooled. The held-out rate uses the same versions as the training rate.

Options: --stages S (default: per model, below), --model smollm2|tiny|DIR (default: cluster.model),
--tasks DIR, --heldout DIR, --report PATH (the `up` report; its PNGs beside it), --png PATH (the bench's
curves; default: <report>-bench.png), --max-minutes M (a hard stop), --tail-s S, --demonstrations N,
--after-min-episodes N, --after-versions N. The bench's learning settings (single-turn, verify-only
oracle, temperature 1, PPO and sandbox knobs, docs/learning.md) are applied unless `--set` names the field.
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

TASKS = Path(__file__).resolve().parent / "bench_learning_tasks"

# Settings for every model: single-turn episodes scored by verification only (speed is not what is learned
# here), with the oracle's timing protocol trimmed; gamma = lambda = 1 (docs/learning.md).
COMMON = {
    "actor.episode_mode": "single_turn", "actor.final_eval_mode": "verify", "actor.temperature": 1.0,
    "actor.concurrency": 4, "actor.max_version_lag": 2, "learner.batch_trajectories": 4, "learner.lam": 1.0,
    "learner.clip_low": 0.1, "learner.max_staleness": 2, "sandbox.compile_baseline": False,
    "sandbox.trials": 5, "sandbox.warmup": 1, "sandbox.correctness_trials": 2, "sandbox.timing_budget_s": 0.3,
}
# Per model: the stage schedule and the learning knobs. The tiny random model is the CI learning test's
# configuration (tests/learning/test_learning.py). SmolLM2-135M: a learner step over 4 episodes of ~1.2k tokens
# takes ~4 min on 2 cores (policy and critic forward and backward), so few optimiser steps fit in ~40 minutes
# (2 RFT steps of 6 passes each, 3 PPO steps), at learning rates for a pretrained model.
PROFILES = {
    "tiny": {"stages": "rft:2@3e-3,critic:1,ppo:6@2e-4", "tail_s": 60.0, "max_minutes": 30.0,
             "set": {"actor.max_new_tokens": 288, "learner.rft_epochs": 90, "learner.ppo_epochs": 4,
                     "learner.critic_lr": 1e-3}},
    "real": {"stages": "rft:2@2e-4,ppo:3@2e-5", "tail_s": 240.0, "max_minutes": 60.0,
             "set": {"actor.max_new_tokens": 256, "learner.rft_epochs": 6, "learner.ppo_epochs": 1,
                     "learner.critic_lr": 1e-4, "learner.token_budget": 1536}},  # one episode per micro-batch
}


def _options(rest: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kernelrl bench learning", add_help=False)
    p.add_argument("--stages", default="")
    p.add_argument("--model", default="")
    p.add_argument("--tasks", default=str(TASKS / "train"))
    p.add_argument("--heldout", default=str(TASKS / "heldout"))
    p.add_argument("--report", default="kernelrl-bench-learning-report.json")
    p.add_argument("--png", default="")
    p.add_argument("--max-minutes", type=float, default=0.0)
    p.add_argument("--tail-s", type=float, default=-1.0)
    p.add_argument("--demonstrations", type=int, default=0)
    p.add_argument("--after-min-episodes", type=int, default=4)
    p.add_argument("--after-versions", type=int, default=3)
    return p.parse_args(rest)


# ---- pure logic (tests/learning/test_bench_learning.py) ----------------------------------------------------

def pooled(rows: list[dict], versions: set[int] | list[int]) -> tuple[float | None, int]:
    """(pass rate, episodes) of the rows of ``versions`` pooled (None when they hold no episode)."""
    pick = [r for r in rows if r["version"] in set(versions)]
    n = sum(r["episodes"] for r in pick)
    return (sum(r["pass_rate"] * r["episodes"] for r in pick) / n if n else None), n


def after_versions(rows: list[dict], min_episodes: int, max_versions: int) -> list[int]:
    """The versions pooled for "after": the last version (> 0) with episodes, then earlier ones (never 0),
    newest first, until ``min_episodes`` episodes are pooled or ``max_versions`` versions are taken."""
    out, n = [], 0
    for r in sorted((r for r in rows if r["version"] > 0 and r["episodes"] > 0), key=lambda r: -r["version"]):
        if len(out) >= max(1, max_versions) or (out and n >= min_episodes):
            break
        out.append(r["version"])
        n += r["episodes"]
    return sorted(out)


def before_after(train: list[dict], heldout: list[dict], min_episodes: int = 4, max_versions: int = 3) -> dict:
    """pass_rate_before/after and the held-out ones, with the episodes and versions behind each."""
    after = after_versions(train, min_episodes, max_versions)
    out = {"before_versions": [0], "after_versions": after}
    for key, rows in (("pass_rate", train), ("heldout_pass_rate", heldout)):
        rate0, n0 = pooled(rows, [0])
        rate1, n1 = pooled(rows, after)
        out.update({f"{key}_before": rate0, f"{key}_after": rate1,
                    f"{key}_before_episodes": n0, f"{key}_after_episodes": n1})
    return out


def stage_segments(by_step: list[dict], curve: list[dict], started_ms: float, ended_ms: float) -> dict:
    """Wall seconds per stage segment (consecutive steps of one stage; ``by_stage``), from the learner's step records.

    A segment's wall time runs from the previous segment's last step record (the first one: from the start of
    its first step, ``created_ms - step_s``) to its own last step record; ``startup_s`` is the time before the
    first step began (broker, roles, vLLM, demonstrations, the first batch), ``tail_s`` the time after the last
    step record (the final version's episodes, the shutdown). ``compute_s`` sums the steps' own ``step_s``."""
    step_s = {c["step"]: float(c.get("step_s", 0.0)) for c in curve}
    segs: list[dict] = []
    for s in sorted(by_step, key=lambda s: s["step"]):
        if not segs or segs[-1]["stage"] != s["stage"]:
            segs.append({"stage": s["stage"], "steps": 0, "first_step": s["step"], "compute_s": 0.0,
                         "_first_ms": s["created_ms"] - 1000 * step_s.get(s["step"], 0.0)})
        seg = segs[-1]
        seg["steps"] += 1
        seg["compute_s"] += step_s.get(s["step"], 0.0)
        seg["_last_ms"] = s["created_ms"]
    prev = segs[0]["_first_ms"] if segs else ended_ms
    for seg in segs:
        seg["wall_s"] = round((seg["_last_ms"] - prev) / 1000, 1)
        seg["compute_s"] = round(seg["compute_s"], 1)
        prev = seg.pop("_last_ms")
        seg.pop("_first_ms")
    first = (by_step and min(by_step, key=lambda s: s["step"]))
    start = first["created_ms"] - 1000 * step_s.get(first["step"], 0.0) if first else ended_ms
    return {"by_stage": segs, "startup_s": round(max(start - started_ms, 0) / 1000, 1),
            "tail_s": round(max(ended_ms - prev, 0) / 1000, 1)}


def learner_steps(by_step: list[dict], curve: list[dict]) -> list[dict]:
    """Per learner step: stage, the version it made, its trained episodes' mean reward, loss and the like."""
    metrics = {c["step"]: c for c in curve}
    keys = ("loss", "policy_loss", "value_loss", "entropy", "kl_behaviour", "kl_fresh", "reward_logp_cov", "step_s")
    return [{"step": s["step"], "stage": s["stage"], "policy_version": s["policy_version"],
             "episodes": s["episodes"], "mean_reward": s["mean_reward"],
             **{k: metrics.get(s["step"], {}).get(k) for k in keys if k in metrics.get(s["step"], {})}}
            for s in sorted(by_step, key=lambda s: s["step"])]


def summarize(report: dict, *, model: str, stages: str, started_ms: float, ended_ms: float,
              min_episodes: int = 4, max_versions: int = 3) -> dict:
    """The bench's JSON from an `up` report (report["learning"], report["learner_curve"])."""
    learning = report.get("learning") or {}
    train, held = learning.get("by_version", []), learning.get("heldout_by_version", [])
    by_step, curve = learning.get("by_step", []), report.get("learner_curve", [])
    out = {"bench": "learning", "model": model, "stages": stages, "ok": False}
    out.update(before_after(train, held, min_episodes, max_versions))
    out.update({
        "episodes": sum(r["episodes"] for r in train), "heldout_episodes": sum(r["episodes"] for r in held),
        "heldout_trained": learning.get("heldout_trained"),
        "demonstrations": learning.get("demonstrations"),
        "demonstrations_passed": learning.get("demonstrations_passed"),
        "by_version": train, "heldout_by_version": held,
        "learner_steps": learner_steps(by_step, curve),
        **stage_segments(by_step, curve, started_ms, ended_ms),
        "total_wall_s": round((ended_ms - started_ms) / 1000, 1),
        "up_ok": report.get("ok"), "up_error": report.get("error"), "stopped_by": report.get("stopped_by"),
        "trajectories_lost": report.get("trajectories_lost"), "learner_steps_done": report.get("learner_steps"),
    })
    # the bench is sound when `up` was, no held-out episode was trained on, and both rates could be measured
    out["ok"] = bool(report.get("ok") and learning.get("heldout_trained") == 0
                     and out["pass_rate_before"] is not None and out["pass_rate_after"] is not None)
    return out


def plot(result: dict, path: str | Path) -> str:
    """Two panels: pass rate per version (training tasks by stage, held-out dashed; cluster/launch/report.py's
    plot) and the mean reward of each learner step's trained episodes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cluster.launch.report import plot_pass_rate

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.6))
    plot_pass_rate(a, result["by_version"], result["heldout_by_version"])
    steps = [s for s in result["learner_steps"] if s.get("mean_reward") is not None]
    for stage in dict.fromkeys(s["stage"] for s in steps):
        pts = [s for s in steps if s["stage"] == stage]
        b.plot([s["step"] for s in pts], [s["mean_reward"] for s in pts], marker="o", label=stage)
    b.set_ylim(-1.1, 1.1)
    b.set_xlabel("learner step")
    b.set_ylabel("mean reward of the trained episodes")
    b.set_title(f"{result['model']}: {result['stages']}", fontsize="small")
    if steps:
        b.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


# ---- the run ------------------------------------------------------------------------------------------------

def _user_set(args) -> set[str]:
    return {s.split("=", 1)[0].strip() for s in (getattr(args, "set", None) or []) if "=" in s}


def run_bench(args, cfg) -> dict:
    from cluster.config import set_value, validate
    from cluster.errors import InputError
    from cluster.launch.feeder import load_heldout_tasks, load_task_files
    from cluster.models.importer import is_tiny
    from cluster.launch.run_loop import run_cluster

    opt = _options(args.rest or [])
    if logging.getLogger().level > logging.INFO:  # progress on stderr (stdout is the JSON)
        for name in (__name__, "cluster.launch.run_loop", "cluster.launch.dashboard"):
            logging.getLogger(name).setLevel(logging.INFO)
    model = opt.model or cfg.cluster.model
    tiny = is_tiny(model) and not cfg.actor.model_path
    prof = PROFILES["tiny" if tiny else "real"]
    stages = opt.stages or prof["stages"]
    for folder, what in ((opt.tasks, "--tasks"), (opt.heldout, "--heldout")):
        if not Path(folder).is_dir():
            raise InputError(f"{what} {folder!r}: no such folder")
    train = load_task_files(opt.tasks)
    if not any(t.metadata.get("demonstration") for t in train) and "rft" in stages:
        raise InputError(f"--tasks {opt.tasks!r}: no task has a <task>.solution/ folder to demonstrate for RFT")
    held = load_heldout_tasks(opt.heldout, train)
    user = _user_set(args)
    settings = {**COMMON, **prof["set"]}
    applied = {k: v for k, v in settings.items() if k not in user}
    for key, value in applied.items():
        set_value(cfg, key, value)
    tail = opt.tail_s if opt.tail_s >= 0 else prof["tail_s"]
    minutes = opt.max_minutes or prof["max_minutes"]
    report_path = Path(opt.report)
    png = Path(opt.png) if opt.png else report_path.with_name(report_path.stem + "-bench.png")
    for key, value in (("cluster.model", model), ("learner.stages", stages), ("cluster.task_dir", opt.tasks),
                       ("cluster.heldout_task_dir", opt.heldout), ("cluster.tail_s", tail),
                       ("cluster.duration_s", minutes * 60), ("cluster.report_path", str(report_path)),
                       ("sandbox.backend", "cpu"), ("actor.policy", "vllm")):
        set_value(cfg, key, value)
    if tiny:  # as a folder (as the CI test runs it): `up` caps the named tiny model's episodes at 64 tokens
        from cluster.models.tiny import build_tiny_model, default_tiny_model_dir

        set_value(cfg, "actor.model_path", str(build_tiny_model(default_tiny_model_dir(cfg))))
    if opt.demonstrations:
        set_value(cfg, "cluster.demonstrations", opt.demonstrations)
    validate(cfg)
    log.info("bench learning: model %s, stages %s, %d training tasks (%s), %d held-out (%s), at most %.0f min",
             model, stages, len(train), ", ".join(t.name for t in train), len(held),
             ", ".join(t.name for t in held), minutes)
    started = time.time() * 1000
    report = run_cluster(cfg, dashboard=False, config_path=getattr(args, "config", None),
                         overrides=getattr(args, "set", None))
    ended = time.time() * 1000
    result = summarize(report, model=model, stages=stages, started_ms=started, ended_ms=ended,
                       min_episodes=opt.after_min_episodes, max_versions=opt.after_versions)
    result.update({"tasks": [t.name for t in train], "heldout_tasks": [t.name for t in held],
                   "settings": applied, "tail_s_setting": tail, "max_minutes": minutes,
                   "report": str(report_path), "run_dir": report.get("run_dir"), "up_plots": report.get("plots")})
    try:
        result["png"] = plot(result, png)
    except ImportError as exc:
        log.warning("no PNG: %s", exc)
        result["png"] = None
    log.info("bench learning: pass rate %s -> %s (held-out %s -> %s), %.0f s", result["pass_rate_before"],
             result["pass_rate_after"], result["heldout_pass_rate_before"], result["heldout_pass_rate_after"],
             result["total_wall_s"])
    return result
