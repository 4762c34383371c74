"""`kernelrl bench learning`'s pure logic (before/after, held-out counting, stage wall times, the JSON), and the
held-out path that keeps the learner off held-out tasks: the feeder marks them, a real episode carries the mark,
the learner's stage filters drop it in every stage, and the report counts it apart (and counts it if trained)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.launch import bench_learning as bl
from cluster.launch.feeder import load_heldout_tasks, load_task_files
from cluster.launch.report import learning_curve
from learner.data import from_trajectory, stage_rejects
from learner.ingest import Ingest
from learner.stages import STAGES
from schemas.messages import TrainStep
from tests.learner.helpers import make_traj

TASKS = Path(bl.__file__).parent / "bench_learning_tasks"


def _row(v, n, rate, stage="ppo"):
    return {"version": v, "stage": stage, "episodes": n, "pass_rate": rate, "mean_reward": 2 * rate - 1}


def _traj(eid, version, reward, **meta):
    t = make_traj(eid, version=version, reward=reward)
    t.metadata = {"version_start": version, "trainable": True, **meta}
    return t


# ---- before / after --------------------------------------------------------------------------------------------

def test_after_pools_the_last_versions_until_enough_episodes():
    rows = [_row(0, 10, 0.0, "initial"), _row(1, 3, 0.0, "rft"), _row(2, 2, 0.5, "rft"), _row(3, 1, 1.0)]
    assert bl.after_versions(rows, min_episodes=4, max_versions=3) == [1, 2, 3]  # 1 + 2 + 3 episodes
    assert bl.after_versions(rows, min_episodes=3, max_versions=3) == [2, 3]
    assert bl.after_versions(rows, min_episodes=1, max_versions=3) == [3]
    assert bl.after_versions(rows, min_episodes=100, max_versions=2) == [2, 3]  # capped
    assert bl.after_versions([_row(0, 5, 0.0)], 4, 3) == []  # version 0 is never "after"
    assert bl.after_versions([_row(0, 5, 0.0), _row(4, 0, 0.0), _row(2, 4, 1.0)], 4, 3) == [2]  # empty rows skipped


def test_before_after_uses_the_training_versions_for_the_heldout_rate_too():
    train = [_row(0, 8, 0.0, "initial"), _row(1, 2, 0.5, "rft"), _row(2, 4, 0.75)]
    held = [_row(0, 5, 0.2, "initial"), _row(1, 1, 1.0, "rft"), _row(2, 2, 0.5), _row(3, 3, 1.0)]
    out = bl.before_after(train, held, min_episodes=4, max_versions=3)
    assert out["before_versions"] == [0] and out["after_versions"] == [2]
    assert out["pass_rate_before"] == 0.0 and out["pass_rate_before_episodes"] == 8
    assert out["pass_rate_after"] == 0.75 and out["pass_rate_after_episodes"] == 4
    # version 3 has held-out episodes only: not among the training rate's versions, so not counted
    assert out["heldout_pass_rate_before"] == pytest.approx(0.2) and out["heldout_pass_rate_after"] == 0.5
    assert out["heldout_pass_rate_after_episodes"] == 2
    empty = bl.before_after([], [])
    assert empty["pass_rate_before"] is None and empty["heldout_pass_rate_after"] is None


# ---- the report counts held-out episodes apart -----------------------------------------------------------------

def test_learning_curve_counts_heldout_apart_and_counts_any_trained():
    trajs = [_traj("a", 0, -1.0), _traj("b", 0, 1.0, heldout=True), _traj("c", 1, 1.0), _traj("d", 1, -1.0),
             _traj("e", 1, 1.0, heldout=True), _traj("f", 1, -1.0, heldout=True),
             _traj("demo", 0, 1.0, demonstration=True)]
    steps = [TrainStep(step=1, policy_version=1, stage="rft", episode_ids=["demo", "c"], created_ms=1000)]
    cur = learning_curve(trajs, steps)
    assert [(r["version"], r["episodes"], r["pass_rate"]) for r in cur["by_version"]] == [(0, 1, 0.0), (1, 2, 0.5)]
    assert [(r["version"], r["episodes"], r["pass_rate"]) for r in cur["heldout_by_version"]] == \
        [(0, 1, 1.0), (1, 2, 0.5)]
    assert cur["heldout_by_version"][1]["stage"] == "rft" and cur["heldout_trained"] == 0
    assert cur["by_step"] == [{"step": 1, "stage": "rft", "policy_version": 1, "episodes": 2, "mean_reward": 1.0,
                               "created_ms": 1000}]
    bad = [TrainStep(step=1, policy_version=1, stage="ppo", episode_ids=["b", "c"])]
    assert learning_curve(trajs, bad)["heldout_trained"] == 1  # a held-out episode trained on is seen


def test_an_episode_cut_by_a_weight_swap_counts_for_no_version():
    """The actor keeps in-flight requests across a swap: an episode begun with version 0 and finished by
    version 1 measures neither (the random model's version 0 must not be credited with version 1's pass)."""
    import numpy as np

    pure, cut = _traj("a", 0, -1.0), _traj("b", 0, 1.0)
    ver = np.asarray(cut.policy_version).copy()
    gen = np.flatnonzero(ver >= 0)
    ver[gen[len(gen) // 2:]] = 1  # the second half of its tokens sampled after the swap
    cut.policy_version = ver
    cur = learning_curve([pure, cut, _traj("c", 1, 1.0)], [])
    assert [(r["version"], r["episodes"], r["pass_rate"]) for r in cur["by_version"]] == [(0, 1, 0.0), (1, 1, 1.0)]
    assert cur["episodes_across_versions"] == 1


def test_modes_are_counted_by_the_version_an_episode_began_with():
    """`actor.episode_mode = by_stage` picks the mode when an episode begins: a single-turn episode begun under
    version 0 whose request waited in the engine across the swap is sampled by version 1 (counted for it in
    ``by_version``), and still counts as begun under version 0 in ``modes_by_version_start``."""
    queued = make_traj("q", version=1, reward=-1.0, mode="single_turn")
    queued.metadata = {"version_start": 0, "trainable": True}
    trajs = [_traj("a", 0, -1.0), queued, make_traj("m", version=1, reward=1.0, mode="multi_turn")]
    trajs[0].mode = "single_turn"
    trajs[2].metadata = {"version_start": 1, "trainable": True}
    cur = learning_curve(trajs, [])
    assert {r["version"]: r["modes"] for r in cur["by_version"]} == {0: ["single_turn"],
                                                                    1: ["multi_turn", "single_turn"]}
    assert cur["modes_by_version_start"] == {"0": ["single_turn"], "1": ["multi_turn"]}


# ---- the learner never trains on a held-out episode ------------------------------------------------------------

@pytest.mark.parametrize("stage", STAGES)
def test_no_stage_trains_on_a_heldout_episode(stage):
    held = from_trajectory(_traj("h", 0, 1.0, heldout=True))
    assert held.flags["heldout"] and stage_rejects(held, stage) == "heldout"
    ing = Ingest(stage, max_staleness=4)
    ing.offer(_traj("h", 0, 1.0, heldout=True), 0, 0)
    ing.offer(_traj("t", 0, 1.0, mode="single_turn"), 0, 1)
    ing.offer(_traj("h2", 0, 1.0, heldout=True), 0, 2)
    ing.set_stage(stage)  # a stage switch judges the buffer again: still dropped
    taken = [s.episode_id for s in ing.take(10, 0)]
    assert "h" not in taken and "h2" not in taken and ing.dropped["heldout"] == 2
    assert ing.positions == {0: 3}  # consumed, never waited for


def test_heldout_tasks_are_marked_and_never_demonstrated():
    train = load_task_files(TASKS / "train")
    held = load_heldout_tasks(TASKS / "heldout", train)
    assert {t.name for t in train} == {"relu", "square", "leaky_relu"} and {t.name for t in held} == {"abs", "add_one"}
    assert all(t.metadata.get("demonstration") for t in train)  # every training task has its solution
    assert all(t.metadata == {"heldout": True} for t in held)  # their solutions are dropped: never demonstrated
    from cluster.errors import InputError

    with pytest.raises(InputError, match="names of training tasks"):
        load_heldout_tasks(TASKS / "train", train)


def test_a_real_episode_of_a_heldout_task_carries_the_mark(tiny_model, tmp_path):
    import asyncio

    from actors.agent import EpisodeLimits
    from actors.policy import ScriptedPolicy, load_tokenizer
    from tests.actors.helpers import make_episode, relu_task

    policy = ScriptedPolicy(load_tokenizer(tiny_model), ["no kernel today"])
    limits = EpisodeLimits(max_turns=1, max_context_tokens=8192, mode="single_turn")
    marked = asyncio.run(make_episode(policy, relu_task(heldout=True), tmp_path / "a", limits).run())
    plain = asyncio.run(make_episode(policy, relu_task(), tmp_path / "b", limits).run())
    assert marked.metadata["heldout"] is True and "heldout" not in plain.metadata
    assert stage_rejects(from_trajectory(marked), "rft") == "heldout"


# ---- stage wall times and the JSON -----------------------------------------------------------------------------

def _report():
    steps = [(1, "rft", 100_000, 50.0), (2, "rft", 160_000, 55.0), (3, "ppo", 230_000, 60.0),
             (4, "ppo", 300_000, 61.0)]
    by_step = [{"step": s, "stage": st, "policy_version": s, "episodes": 4, "mean_reward": 0.5 if st == "rft" else 0.0,
                "created_ms": ms} for s, st, ms, _ in steps]
    curve = [{"step": s, "stage": st, "loss": 1.0 / s, "step_s": secs, "entropy": 2.0} for s, st, _, secs in steps]
    learning = {"by_version": [_row(0, 6, 0.0, "initial"), _row(3, 2, 0.5), _row(4, 3, 1.0)],
                "heldout_by_version": [_row(0, 4, 0.0, "initial"), _row(4, 2, 0.5)], "by_step": by_step,
                "demonstrations": 8, "demonstrations_passed": 8, "heldout_trained": 0}
    return {"ok": True, "learning": learning, "learner_curve": curve, "learner_steps": 4, "trajectories_lost": 0,
            "stopped_by": "learner finished"}


def test_stage_segments_split_the_wall_time():
    rep = _report()
    seg = bl.stage_segments(rep["learning"]["by_step"], rep["learner_curve"], started_ms=20_000, ended_ms=360_000)
    assert seg["startup_s"] == 30.0  # the first step began at 100 s - 50 s
    assert seg["by_stage"] == [{"stage": "rft", "steps": 2, "first_step": 1, "compute_s": 105.0, "wall_s": 110.0},
                             {"stage": "ppo", "steps": 2, "first_step": 3, "compute_s": 121.0, "wall_s": 140.0}]
    assert seg["tail_s"] == 60.0
    assert bl.stage_segments([], [], 0, 5000) == {"by_stage": [], "startup_s": 5.0, "tail_s": 0.0}


def test_summary_json_shape(tmp_path):
    out = bl.summarize(_report(), model="tiny", stages="rft:2,ppo:2", started_ms=20_000, ended_ms=360_000,
                       min_episodes=4, max_versions=3)
    for key in ("pass_rate_before", "pass_rate_after", "heldout_pass_rate_before", "heldout_pass_rate_after",
                "by_version", "heldout_by_version", "learner_steps", "by_stage", "stages", "total_wall_s", "model", "ok"):
        assert key in out, key
    assert out["stages"] == "rft:2,ppo:2" and [s["stage"] for s in out["by_stage"]] == ["rft", "ppo"]
    assert out["ok"] and out["pass_rate_before"] == 0.0 and out["after_versions"] == [3, 4]
    assert out["pass_rate_after"] == pytest.approx(0.8) and out["heldout_pass_rate_after"] == 0.5
    assert out["total_wall_s"] == 340.0 and out["episodes"] == 11 and out["heldout_episodes"] == 6
    assert [s["mean_reward"] for s in out["learner_steps"]] == [0.5, 0.5, 0.0, 0.0]
    assert out["learner_steps"][2] == {"step": 3, "stage": "ppo", "policy_version": 3, "episodes": 4,
                                       "mean_reward": 0.0, "loss": pytest.approx(1 / 3), "entropy": 2.0,
                                       "step_s": 60.0}
    json.dumps(out)  # serialisable as it is
    rep = _report()
    rep["learning"]["heldout_trained"] = 1
    assert not bl.summarize(rep, model="tiny", stages="", started_ms=0, ended_ms=1)["ok"]
    png = bl.plot(out, tmp_path / "curves.png")
    assert Path(png).stat().st_size > 1000


def test_the_learner_backlog_gate_widens_by_the_heldout_share():
    """Held-out episodes sit in the learner's backlog without being trained: with 2 of 5 tasks held out the
    trajectory gate is 5/3 of the plain one (rounded up), so they cannot shut the feeder out."""
    import types

    from cluster.config import Config
    from cluster.launch.run_loop import _gates
    from schemas import Task, topics

    cfg = Config()
    cfg.learner.batch_trajectories, cfg.learner.max_staleness = 4, 2
    bus = types.SimpleNamespace(group=lambda name: name)
    train = [Task(task_id=f"t{i}", model_py="") for i in range(3)]
    held = [Task(task_id=f"h{i}", model_py="", metadata={"heldout": True}) for i in range(2)]
    plain = dict((tp, lim) for _, tp, lim in _gates(bus, cfg, train))
    wide = dict((tp, lim) for _, tp, lim in _gates(bus, cfg, train + held))
    assert wide[topics.TASKS] == plain[topics.TASKS]
    assert wide[topics.TRAJECTORIES] == -(-plain[topics.TRAJECTORIES] * 5 // 3) > plain[topics.TRAJECTORIES]
