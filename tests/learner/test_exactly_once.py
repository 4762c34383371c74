"""SIGKILL the learner after a checkpoint; the restarted learner trains exactly the trajectories after it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter

from schemas import topics

from .conftest import learner_cfg
from .helpers import make_traj, wait_checkpoint

N_TRAJ, BATCH, STEPS = 12, 2, 6


def test_sigkill_after_checkpoint_then_restart_trains_each_trajectory_once(ds_process, tiny_model, make_cfg,
                                                                          spawn, tmp_path):
    from cluster.bus.client import Bus
    from cluster.bus.scan import read_topic
    from tests.conftest import KERNELRL, cfg_env

    cfg = learner_cfg(make_cfg(), stage="ppo", batch_trajectories=BATCH, checkpoint_every=1, publish_every=2,
                      weight_transport="kafka", checkpoint_dir=str(tmp_path / "ckpt"), model_path=tiny_model)
    bus = Bus(cfg, client_id="test-feeder")
    prod = bus.producer()
    where = {}
    for i in range(N_TRAJ):
        meta = prod.send(topics.TRAJECTORIES, make_traj(f"ep{i:02d}", n=64, seed=i, reward=(-1.0) ** i),
                         key=f"task-{i}").get()
        where[f"ep{i:02d}"] = (meta.partition, meta.offset)
    prod.close()
    env = cfg_env(cfg)
    args = KERNELRL + ["learner", "--max-steps", str(STEPS), "--idle-wait", "2"]
    state_file = tmp_path / "ckpt" / "STATE.json"
    first = spawn(args, env=env)
    wait_checkpoint(state_file, 2, first)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=10)
    saved = json.loads(state_file.read_text())
    positions = {int(k): v for k, v in saved["ingest"]["positions"].items()}
    after_ckpt = {e for e, (p, o) in where.items() if o >= positions.get(p, 0)}
    assert 0 < len(after_ckpt) < N_TRAJ

    # the restart runs without a step limit: once it has checkpointed the last step, SIGTERM stops it cleanly
    with open(tmp_path / "second.log", "wb") as out:
        second = spawn(KERNELRL + ["learner", "--idle-wait", "1"], env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_checkpoint(state_file, STEPS, second)
    second.send_signal(signal.SIGTERM)
    assert second.wait(timeout=60) == 0, (tmp_path / "second.log").read_text()[-3000:]
    assert json.loads(state_file.read_text())["step"] == STEPS

    log = [r.msg for r in read_topic(bus, topics.LEARNER_LOG)]
    assert sorted(r.step for r in log) == list(range(1, STEPS + 1)), [r.step for r in log]
    trained = Counter(e for r in log for e in r.episode_ids)
    assert set(trained) == set(where) and set(trained.values()) == {1}, trained
    # the restarted process trained exactly the records after the checkpoint's positions
    resumed = {e for r in log if r.step > saved["step"] for e in r.episode_ids}
    assert resumed == after_ckpt
    # weights: versions 1..3 announced in order, each at most re-announced with identical bytes
    anns = [r.msg for r in read_topic(bus, topics.WEIGHTS)]
    versions = [a.version for a in anns]
    assert sorted(set(versions)) == [1, 2, 3] and versions == sorted(versions)
    by_version = {}
    for a in anns:
        assert by_version.setdefault(a.version, a.sha256) == a.sha256
    bus.close()
