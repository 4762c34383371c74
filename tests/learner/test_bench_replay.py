"""The learner part of `bench learning` on recorded trajectories (learner/bench_replay.py): a replay folder
written the way `kernelrl replay --to-dir` writes it, trained on with a stage schedule by the real Trainer."""
from __future__ import annotations

from schemas.codec import encode
from tests.learner.conftest import learner_cfg
from tests.learner.helpers import make_traj


def _folder(tmp_path):
    folder = tmp_path / "replay"
    folder.mkdir()
    trajs = [make_traj(f"e{i}", n=40, reward=1.0 if i % 2 else -1.0, seed=i) for i in range(5)]
    trajs[3].has_logprobs = False  # a passing demonstration: RFT takes it, PPO must not
    for i, t in enumerate(trajs):
        (folder / f"000-{i:012d}.msgpack").write_bytes(encode(t))
    (folder / "000-000000000099.msgpack").write_bytes(b"\x93garbage")  # an undecodable record is skipped
    return folder


def test_stages_train_on_the_samples_each_accepts(ds_process, tiny_model, tmp_path):
    from learner import bench_replay

    cfg = learner_cfg(ds_process)
    out = bench_replay.run(cfg, tiny_model, str(_folder(tmp_path)), "rft:1,ppo:2", batch=2)
    out.pop("trainer")
    assert out["records"] == 6 and out["samples"] == 5 and out["skipped"] == {"invalid": 1}
    assert [s["stage"] for s in out["steps"]] == ["rft", "ppo", "ppo"]
    rft, ppo1, ppo2 = out["steps"]
    assert rft["trajectories"] == 2 and rft["tokens"] > 0 and "loss" in rft  # passing episodes e1, e3
    assert ppo1["trajectories"] == 2 and "policy_loss" in ppo1 and "value_loss" in ppo1
    assert out["per_stage"]["ppo"]["steps"] == 2 and out["per_stage"]["ppo"]["tok_s"] > 0


def test_picking_cycles_over_what_a_stage_accepts(tmp_path):
    from learner import bench_replay
    from learner.data import from_trajectory

    samples = [from_trajectory(make_traj(f"e{i}", reward=1.0 if i < 2 else -1.0, seed=i)) for i in range(4)]
    cursor: dict[str, int] = {}
    assert [s.episode_id for s in bench_replay.pick(samples, "rft", 3, cursor)] == ["e0", "e1"]
    assert [s.episode_id for s in bench_replay.pick(samples, "ppo", 3, cursor)] == ["e0", "e1", "e2"]
    assert [s.episode_id for s in bench_replay.pick(samples, "ppo", 3, cursor)] == ["e3", "e0", "e1"]
