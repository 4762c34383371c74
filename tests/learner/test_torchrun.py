"""The learner role under `torchrun --nproc-per-node 2` (gloo, two CPU processes): ranks, world size and the
rendezvous come from the launcher's environment alone; rank 0 reads Kafka and the pair trains; it stops at
--max-steps, and a restarted pair resumes from the checkpoint and stops cleanly on SIGTERM to torchrun.

(tests/learner/test_two_ranks.py drives the Trainer with hand-set ranks; this one runs `kernelrl learner`
itself, as `kernelrl up` with cluster.learner_ranks > 1 and the Kubernetes learner pods do.)"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter

from schemas import topics

from .conftest import learner_cfg
from .helpers import make_traj, wait_checkpoint


def _torchrun(nproc: int, *learner_args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "--shutdown-timeout", "60", "-m", "cluster.cli", "-v", "learner", *learner_args]


def test_learner_under_torchrun_two_ranks_trains_then_stops_on_max_steps_and_sigterm(ds_process, tiny_model,
                                                                                       make_cfg, spawn, tmp_path):
    from cluster.bus.client import Bus
    from cluster.bus.scan import read_topic
    from tests.conftest import cfg_env

    cfg = learner_cfg(make_cfg(), stage="ppo", batch_trajectories=2, checkpoint_every=1, publish_every=1,
                      weight_transport="kafka", checkpoint_dir=str(tmp_path / "ckpt"), model_path=tiny_model,
                      token_budget=128)
    bus = Bus(cfg, client_id="test-feeder")
    prod = bus.producer()
    for i in range(4):
        prod.send(topics.TRAJECTORIES, make_traj(f"ep{i}", n=40, seed=i, reward=(-1.0) ** i), key=f"t{i}").get()
    prod.close()
    env = {**cfg_env(cfg), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # torchrun alone says who is who

    first_log = tmp_path / "first.log"
    with open(first_log, "wb") as out:
        first = spawn(_torchrun(2, "--max-steps", "1", "--idle-wait", "2"), env=env, stdout=out,
                      stderr=subprocess.STDOUT)
        assert first.wait(timeout=180) == 0, first_log.read_text()[-4000:]
    text = first_log.read_text()
    for rank in (0, 1):
        assert f"learner rank {rank} of 2 (from torchrun" in text, text[-4000:]
    state = tmp_path / "ckpt" / "STATE.json"
    saved = json.loads(state.read_text())
    assert saved["step"] == 1 and saved["world"] == 2

    # resumed without a step limit: once it checkpointed step 2, SIGTERM to torchrun reaches both ranks,
    # which finish, checkpoint and exit 0 (torchrun itself reports the signal)
    second_log = tmp_path / "second.log"
    with open(second_log, "wb") as out:
        second = spawn(_torchrun(2, "--idle-wait", "1"), env=env, stdout=out, stderr=subprocess.STDOUT)
        wait_checkpoint(state, 2, second)
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=90)
    text = second_log.read_text()
    assert text.count("learner stopped after 1 steps this run (step 2") == 2, text[-4000:]  # both ranks
    assert json.loads(state.read_text())["step"] == 2

    log = [r.msg for r in read_topic(bus, topics.LEARNER_LOG)]
    assert sorted(r.step for r in log) == [1, 2]
    trained = Counter(e for r in log for e in r.episode_ids)
    assert set(trained) == {f"ep{i}" for i in range(4)} and set(trained.values()) == {1}, trained
    assert sorted({r.msg.version for r in read_topic(bus, topics.WEIGHTS)}) == [1, 2]
    bus.close()


def test_a_local_rank_without_its_gpu_is_a_one_line_error():
    import pytest

    from cluster.errors import SetupError
    from learner.engine import check_local_device

    check_local_device(1, 2, "GPU-a,GPU-b")
    with pytest.raises(SetupError, match=r"LOCAL_RANK 2: this process sees 2 GPU\(s\) \(CUDA_VISIBLE_DEVICES="
                                         r"'GPU-a,GPU-b'\); run at most that many learner ranks per node"):
        check_local_device(2, 2, "GPU-a,GPU-b")
