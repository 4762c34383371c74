"""Replay by offset, by record time and by trajectory fields, on the real broker; weights push."""
import json
import subprocess
import time

import numpy as np

from cluster.bus.client import Bus
from cluster.bus.replay import DirSink, Selection, TopicSink, replay
from schemas import Trajectory, WeightAnnouncement, codec, topics
from tests.conftest import KERNELRL, cfg_env


def _traj(i: int, reward: float, version: int = 0) -> Trajectory:
    n = 8
    return Trajectory(episode_id=f"ep{i}", task_id=f"task{i % 3}", actor_id="a", reward=reward,
                      token_ids=np.arange(n, dtype=np.int32), logprobs=np.zeros(n, np.float32),
                      loss_mask=np.ones(n, np.uint8), policy_version=np.full(n, version, np.int32))


def _publish(bus, trajs, partition=0):
    prod = bus.producer()
    for t in trajs:
        prod.send(topics.TRAJECTORIES, t, key=t.task_id, partition=partition)
    prod.flush()
    prod.close()


def test_replay_by_time_offset_and_filters(cfg, tmp_path):
    with Bus(cfg, client_id="test-replay") as bus:
        _publish(bus, [_traj(i, reward=-1.0 if i % 2 else 3.0, version=i // 5) for i in range(10)])
        time.sleep(1.2)  # record timestamps are ms: leave a clear gap between the two batches
        t_mid = int(time.time() * 1000)
        time.sleep(0.3)
        _publish(bus, [_traj(i, reward=1.0, version=9) for i in range(10, 15)])

        # by time: exactly the second batch
        dest = cfg.topic("replay.time")
        from cluster.bus.topics_admin import create_copy

        assert create_copy(cfg, cfg.topic(topics.TRAJECTORIES), dest, bus.bootstrap) == "created"
        res = replay(bus, Selection(since_ms=t_mid), TopicSink(bus, dest), progress=False)
        assert res["copied"] == 5
        from cluster.bus.scan import read_topic

        got = sorted(r.msg.episode_id for r in read_topic(bus, dest))
        assert got == [f"ep{i}" for i in range(10, 15)]

        # by time, upper bound: exactly the first batch
        res = replay(bus, Selection(until_ms=t_mid), DirSink(tmp_path / "first"), progress=False)
        assert res["copied"] == 10
        index = [json.loads(x) for x in (tmp_path / "first" / "index.jsonl").read_text().splitlines()]
        assert sorted(e["episode_id"] for e in index) == sorted(f"ep{i}" for i in range(10))
        one = codec.decode((tmp_path / "first" / index[0]["file"]).read_bytes())
        assert isinstance(one, Trajectory) and one.num_tokens == 8

        # by offset range on partition 0 plus a reward filter
        res = replay(bus, Selection(from_offset={0: 2}, to_offset={0: 8}, min_reward=0.0),
                     DirSink(tmp_path / "offs"), progress=False)
        ids = [json.loads(x)["episode_id"] for x in (tmp_path / "offs" / "index.jsonl").read_text().splitlines()]
        assert ids == ["ep2", "ep4", "ep6"]  # offsets 2..7, rewards 3.0 only

        # by policy version
        res = replay(bus, Selection(min_version=1, max_version=1), DirSink(tmp_path / "v1"), progress=False)
        ids = [json.loads(x)["episode_id"] for x in (tmp_path / "v1" / "index.jsonl").read_text().splitlines()]
        assert sorted(ids) == [f"ep{i}" for i in range(5, 10)]


def test_replay_cli_to_learner_namespace(cfg):
    with Bus(cfg, client_id="test-replay-cli") as bus:
        _publish(bus, [_traj(i, reward=3.0) for i in range(4)])
    prefix = cfg.bus.topic_prefix + "r1."
    out = subprocess.run(KERNELRL + ["replay", "--to-learner", prefix, "--task", "task1", "--no-progress"],
                         env=cfg_env(cfg), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["copied"] == 1 and res["learner_command"].endswith(f"bus.topic_prefix={prefix} learner")
    cfg.bus.topic_prefix = prefix
    with Bus(cfg, client_id="test-replay-check") as bus:
        from cluster.bus.scan import read_topic

        assert [r.msg.episode_id for r in read_topic(bus, topics.TRAJECTORIES)] == ["ep1"]


def test_weights_push_announces_next_version(cfg, tmp_path):
    from safetensors.numpy import save_file

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file({"w": np.arange(1000, dtype=np.float32)}, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text("{}")
    env = cfg_env(cfg)
    for expected in (1, 2):
        out = subprocess.run(KERNELRL + ["weights", "push", "--path", str(ckpt)], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["version"] == expected
    bad = subprocess.run(KERNELRL + ["weights", "push", "--path", str(ckpt), "--version", "2"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "monotonic" in bad.stderr
    with Bus(cfg, client_id="test-weights") as bus:
        from cluster.weights import transport as wt
        from cluster.cmd_weights import announcements

        anns = announcements(bus, cfg.learner.model_name)
        assert [a.version for a in anns] == [1, 2] and all(isinstance(a, WeightAnnouncement) for a in anns)
        folder = wt.receive(bus, anns[-1], tmp_path / "recv")
        assert (folder / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
        # --transport nccl: the command serves the version itself (gloo here) until SIGTERM
        serve = subprocess.Popen(KERNELRL + ["weights", "push", "--path", str(ckpt), "--transport", "nccl",
                                             "--serve-s", "120"], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            line = json.loads(serve.stdout.readline())
            assert line["version"] == 3 and line["transport"] == "nccl" and line["uri"].startswith("nccl://")
            ann = announcements(bus, cfg.learner.model_name)[-1]
            assert (ann.version, ann.uri) == (3, line["uri"])
            folder = wt.receive(bus, ann, tmp_path / "recv", timeout_s=60)
            assert (folder / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
            serve.terminate()
            _, err = serve.communicate(timeout=60)
            assert serve.returncode == 0 and "served 1 transfers (0 failed)" in err, err[-2000:]
        finally:
            serve.kill()
