"""The run report of `kernelrl up`: invariants computed from the durable Kafka log,
throughput from the roles' metrics, and PNG plots.

Loss is judged from Kafka, not from process counters (which reset when a role is
killed): a task the actors committed without a trajectory is lost; a tool request
with no reply on the replies topic is lost; an episode in two checkpointed
learner steps was trained twice.
"""
from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path

import numpy as np

from schemas import topics
from schemas.messages import (REWARD_UNDETERMINED, CompileRequest, CompileResult, DeadLetter, EvaluateRequest,
                              EvaluateResult, Task, TrainStep, Trajectory, WeightAnnouncement)

log = logging.getLogger(__name__)


def _records(bus, topic: str, kind: type | tuple[type, ...]):
    """The records of ``topic`` that are a ``kind``: a record of another kind (a dead letter, a message
    produced to the wrong topic) is counted by the consumers' dead-letter path, never by the report."""
    from cluster.bus.scan import read_topic

    return [rec for rec in read_topic(bus, topic) if isinstance(rec.msg, kind)]


def durable_invariants(bus, actor_group: str) -> dict:
    """Everything the report asserts, read back from the topics themselves."""
    from cluster.bus.scan import committed_offsets

    traj = _records(bus, topics.TRAJECTORIES, Trajectory)
    steps = _records(bus, topics.LEARNER_LOG, TrainStep)
    tasks = _records(bus, topics.TASKS, Task)
    weights = _records(bus, topics.WEIGHTS, WeightAnnouncement)
    # A request is lost only if its worker group moved past it without any reply: one
    # still uncommitted when the run stopped is durable and will be served on restart.
    requests = []
    for topic, group, kind in ((topics.TOOL_COMPILE, "compile-workers", CompileRequest),
                               (topics.evaluate_topic("cpu"), "eval-workers-cpu", EvaluateRequest),
                               (topics.evaluate_topic("cuda"), "eval-workers-cuda", EvaluateRequest)):
        done = committed_offsets(bus, bus.group(group), topic)
        requests += [(r, r.offset < done.get(r.partition, 0)) for r in _records(bus, topic, kind)]
    replies = _records(bus, topics.TOOL_REPLIES, (CompileResult, EvaluateResult))
    # a consumed request that was dead-lettered (expired, unanswerable) is accounted for, with its reason
    lettered = {(d.msg.source_topic, d.msg.partition, d.msg.offset) for d in _records(bus, topics.DLQ, DeadLetter)}
    lettered_ids = {r.msg.header.request_id for r, consumed in requests
                    if consumed and (r.raw_topic or bus.topic(r.topic), r.partition, r.offset) in lettered}

    episodes = {r.msg.episode_id: r.msg for r in traj}
    traj_tasks = {t.task_id for t in episodes.values()}
    committed = committed_offsets(bus, actor_group, topics.TASKS)
    consumed_tasks = {r.msg.task_id for r in tasks if r.offset < committed.get(r.partition, 0)}
    # a task the actors refused (its episode could not start) is dead-lettered with the reason, not lost
    lettered_tasks = {r.msg.task_id for r in tasks if (r.raw_topic or bus.topic(r.topic), r.partition, r.offset)
                      in lettered}
    trained = Counter(eid for r in steps for eid in r.msg.episode_ids)
    dropped = {eid for r in steps for eid in r.msg.dropped_stale}
    req_ids = {r.msg.header.request_id for r, _ in requests}
    consumed_req_ids = {r.msg.header.request_id for r, consumed in requests if consumed}
    reply_ids = {r.msg.request_id for r in replies}
    undetermined = {e for e, t in episodes.items() if t.reward_status == REWARD_UNDETERMINED}
    rewards = Counter(REWARD_UNDETERMINED if e in undetermined else str(float(t.reward)) for e, t in episodes.items())
    skipped = max((r.msg.metrics.get("trajectories_skipped_undetermined", 0) for r in steps), default=0)
    return {
        "learner_steps": max((r.msg.step for r in steps), default=0),
        "episodes_finished": len(episodes),
        "trajectories_published": len(episodes),
        "trajectory_messages": len(traj),
        "trajectories_trained": len(trained),
        "trajectories_trained_twice": sum(1 for c in trained.values() if c > 1),
        "trajectories_dropped_stale": len(dropped),
        # episodes whose reward the infrastructure kept from being measured; the learner skips them
        "trajectories_undetermined": len(undetermined),
        "trajectories_skipped_undetermined": skipped,
        "trajectories_lost": len(consumed_tasks - traj_tasks - lettered_tasks),
        "tasks_consumed": len(consumed_tasks),
        "tasks_dead_lettered": len(lettered_tasks - traj_tasks),
        **duplicate_work(traj, episodes, replies),
        "tool_calls_sent": len(req_ids),
        "tool_calls_lost": len(consumed_req_ids - reply_ids - lettered_ids),
        "tool_calls_dead_lettered": len(lettered_ids - reply_ids),
        "tool_calls_pending_at_stop": len(req_ids - consumed_req_ids - reply_ids),
        "weight_versions_published": len({r.msg.version for r in weights}),
        "reward_histogram": dict(sorted(rewards.items(), key=lambda kv: _reward_key(kv[0]))),
        "learner_curve": [{"step": r.msg.step, "stage": r.msg.stage, **{k: v for k, v in r.msg.metrics.items()
                                                                     if isinstance(v, (int, float))}} for r in steps],
        "learning": learning_curve(list(episodes.values()), [r.msg for r in steps]),
    }


def duplicate_work(traj: list, episodes: dict, replies: list) -> dict:
    """Work done more than once, read from the topics: a task record rolled out by two episodes (its actor
    died or lost its partition after publishing and before committing), a trajectory written twice (a
    producer retry; the learner's dedupe absorbs it), a tool request answered twice (a worker redid it)."""
    by_task_record = Counter((t.metadata.get("task_partition"), t.metadata.get("task_offset"))
                             for t in episodes.values() if t.metadata.get("task_offset") is not None)
    answers = Counter(r.msg.request_id for r in replies)
    return {"tasks_rolled_out_twice": sum(1 for c in by_task_record.values() if c > 1),
            "trajectory_messages_duplicated": len(traj) - len(episodes),
            "tool_calls_answered_twice": sum(1 for c in answers.values() if c > 1)}


def sampled_with(traj) -> int | None:
    """The one policy version that generated every token of ``traj``; None when a swap came mid-episode (the
    actor keeps in-flight requests across a swap, so such an episode is two policies' and measures neither).
    Without per-token versions: the version it started with."""
    v = np.asarray(traj.policy_version)
    v = v[v >= 0]
    if v.size == 0:
        return int(traj.metadata.get("version_start", 0))
    return int(v[0]) if v.min() == v.max() else None


def learning_curve(trajectories: list, steps: list) -> dict:
    """Pass rate (reward > 0) of the policy's own episodes per policy version they were sampled with,
    and which stage made each version: the evidence that the loop learns.

    Own episodes are trainable ones (the engine's own tokens) that are not demonstrations; an episode
    counts for the one version that generated all its tokens (``sampled_with``; one cut by a swap counts for
    none, in ``episodes_across_versions``); ``modes_by_version_start``: the episode modes begun under each
    version (by the version the actor had applied at an episode's start). Undetermined rewards are left out. Episodes of held-out tasks
    (``metadata.heldout``, never trained on) are counted apart, in ``heldout_by_version``; ``by_step`` is
    each learner step's trained episodes (count, mean reward) and when its record was written."""
    by_version: dict[int, list] = {}  # version -> its own episodes
    # version the actor had applied when an episode began -> the modes begun then: the mode is chosen at the
    # start (actor.episode_mode by_stage), while a queued request may be sampled by the next version
    modes_at_start: dict[int, set] = {}
    heldout: dict[int, list] = {}
    across = 0  # episodes a weight swap cut in two: counted for no version
    demos = [t for t in trajectories if t.metadata.get("demonstration")]
    for t in trajectories:
        meta = t.metadata
        if meta.get("demonstration") or not meta.get("trainable", True) or t.reward_status == REWARD_UNDETERMINED:
            continue
        modes_at_start.setdefault(int(meta.get("version_start", 0)), set()).add(t.mode)
        version = sampled_with(t)
        if version is None:
            across += 1
            continue
        into = heldout if meta.get("heldout") else by_version
        into.setdefault(version, []).append(t)
    made_by = {}  # version -> the stage of the step that published it
    for st in sorted(steps, key=lambda s: s.step):
        made_by.setdefault(st.policy_version, st.stage)

    def rows(by: dict[int, list]) -> list[dict]:
        return [{"version": v, "stage": made_by.get(v, "initial" if v == 0 else ""), "episodes": len(ts),
                 "pass_rate": sum(t.reward > 0 for t in ts) / len(ts),
                 "mean_reward": sum(float(t.reward) for t in ts) / len(ts),
                 "modes": sorted({t.mode for t in ts})}  # single/multi-turn (actor.episode_mode by_stage)
                for v, ts in sorted(by.items())]

    reward = {t.episode_id: float(t.reward) for t in trajectories if t.reward_status != REWARD_UNDETERMINED}
    held_ids = {t.episode_id for t in trajectories if t.metadata.get("heldout")}
    by_step = []
    for st in sorted(steps, key=lambda s: s.step):
        rs = [reward[e] for e in st.episode_ids if e in reward]
        by_step.append({"step": st.step, "stage": st.stage, "policy_version": st.policy_version,
                        "episodes": len(st.episode_ids), "mean_reward": sum(rs) / len(rs) if rs else None,
                        "created_ms": st.created_ms})
    return {"by_version": rows(by_version), "heldout_by_version": rows(heldout), "by_step": by_step,
            "demonstrations": len(demos), "demonstrations_passed": sum(1 for t in demos if t.reward > 0),
            "episodes_across_versions": across,
            "modes_by_version_start": {str(v): sorted(m) for v, m in sorted(modes_at_start.items())},
            "heldout_trained": sum(1 for st in steps for e in st.episode_ids if e in held_ids)}


def final_version_episodes(bus) -> tuple[int, int]:
    """(the last learner step's version, how many of the policy's own episodes it has on the trajectories
    topic so far), counted as ``learning_curve`` counts them; (-1, 0) before any step."""
    steps = _records(bus, topics.LEARNER_LOG, TrainStep)
    if not steps:
        return -1, 0
    final = max(r.msg.policy_version for r in steps)
    rows = learning_curve([r.msg for r in _records(bus, topics.TRAJECTORIES, Trajectory)], [])["by_version"]
    return final, sum(r["episodes"] for r in rows if r["version"] == final)


def pass_rate(rows: list[dict], first: int = 0, last: int = 0) -> tuple[float, int]:
    """(pass rate, episodes) pooled over the first or last N versions of ``learning.by_version`` rows."""
    pick = rows[:first] if first else rows[-last:] if last else rows
    n = sum(r["episodes"] for r in pick)
    return (sum(r["pass_rate"] * r["episodes"] for r in pick) / n if n else 0.0), n


def _reward_key(key: str) -> tuple[int, float]:
    """Histogram order: rewards ascending, then "undetermined"."""
    try:
        return 0, float(key)
    except ValueError:
        return 1, 0.0


def role_throughput(snaps: dict[str, dict]) -> dict:
    out = {}
    for role, s in snaps.items():
        if not s:
            continue
        up = max(s.get("uptime_s", 0.0), 1e-9)
        out[role] = {k: v / up for k, v in s.get("counters", {}).items()}
        out[role]["uptime_s"] = up
    return out


def applied_min(snaps: dict[str, dict]) -> int:
    vals = [s.get("counters", {}).get("weight_versions_applied", 0) for r, s in snaps.items()
            if r.startswith("actor") and s and s.get("info", {}).get("policy") != "scripted"]
    return int(min(vals)) if vals else 0


def plot(report: dict, out_prefix: Path) -> list[str]:
    """Reward histogram and learner curve as PNGs next to the JSON report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(5, 3.2))
    hist = report.get("reward_histogram", {})
    ax.bar(list(hist.keys()), list(hist.values()), color="#4477aa")
    ax.set_xlabel("episode reward")
    ax.set_ylabel("episodes")
    ax.set_title("reward distribution")
    fig.tight_layout()
    p = f"{out_prefix}-rewards.png"
    fig.savefig(p, dpi=100)
    plt.close(fig)
    paths.append(p)
    curve = report.get("learner_curve", [])
    keys = [k for k in ("loss", "policy_loss", "value_loss", "kl", "entropy", "clip_frac")
            if any(k in c and math.isfinite(c[k]) for c in curve)]
    if curve and keys:
        fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 3), squeeze=False)
        for ax, k in zip(axes[0], keys):
            pts = [(c["step"], c[k]) for c in curve if k in c]
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o")
            ax.set_title(k)
            ax.set_xlabel("step")
        fig.tight_layout()
        p = f"{out_prefix}-learner.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    rows = report.get("learning", {}).get("by_version", [])
    if rows:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        plot_pass_rate(ax, rows, report.get("learning", {}).get("heldout_by_version", []))
        fig.tight_layout()
        p = f"{out_prefix}-learning.png"
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def plot_pass_rate(ax, rows: list[dict], heldout: list[dict] = ()) -> None:
    """Pass rate per policy version on a matplotlib axis: one line per stage that made the versions, and the
    held-out tasks' episodes (never trained on) dashed (the report's PNG and `kernelrl bench learning`'s)."""
    for stage in dict.fromkeys(r["stage"] for r in rows):
        pts = [(r["version"], r["pass_rate"]) for r in rows if r["stage"] == stage]
        ax.plot([v for v, _ in pts], [p for _, p in pts], marker="o", linestyle="-", label=stage or "?")
    if heldout:
        ax.plot([r["version"] for r in heldout], [r["pass_rate"] for r in heldout], marker="s", linestyle="--",
                color="black", label="held-out tasks")
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("policy version the episode was sampled with")
    ax.set_ylabel("pass rate (reward > 0)")
    ax.set_title("the policy's own episodes")
    ax.legend(title="version made by", fontsize="small")


def write(report: dict, path: str | Path) -> dict:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prefix = path.with_suffix("")
    try:
        report["plots"] = plot(report, prefix)
    except ImportError as exc:
        log.warning("no plots: %s", exc)
        report["plots"] = []
    path.write_text(json.dumps(report, indent=2, default=str))
    return report
