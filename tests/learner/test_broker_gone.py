"""The broker dies (kill -9) under an idle learner, or is gone before it starts, then the learner gets SIGTERM (as
when `kernelrl up` is killed and its children get their parent-death signal): it must stop promptly, not retry
Kafka for minutes (seen once after `up` was SIGKILLed; not reproduced in these two phases)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from schemas import topics

from .conftest import learner_cfg
from .helpers import make_traj, wait_checkpoint

STOP_WITHIN_S = 60.0


@pytest.mark.parametrize("phase", ["idle", "startup"])
def test_sigterm_stops_the_learner_promptly_after_the_broker_died(phase, ds_process, tiny_model, make_cfg, spawn,
                                                                  tmp_path):
    from cluster.broker import embedded as broker
    from cluster.bus import topics_admin
    from cluster.bus.client import Bus
    from tests.conftest import KERNELRL, cfg_env

    base = make_cfg()
    cfg = learner_cfg(dataclasses.replace(base, broker=dataclasses.replace(base.broker),
                                          bus=dataclasses.replace(base.bus)),
                      stage="ppo", batch_trajectories=2, checkpoint_every=1, publish_every=1,
                      weight_transport="kafka", checkpoint_dir=str(tmp_path / "ckpt"), model_path=tiny_model)
    cfg.broker.state_dir, cfg.broker.heap_mb = tempfile.mkdtemp(prefix="krl-test-kafka-gone-"), 384
    cfg.bus.bootstrap_servers = broker.start(cfg, tie_to_parent=True)["bootstrap"]
    try:
        topics_admin.create_all(cfg)
        with Bus(cfg, client_id="feeder") as bus:
            prod = bus.producer()
            for i in range(2):
                prod.send(topics.TRAJECTORIES, make_traj(f"ep{i}", n=32, seed=i, reward=1.0), key=f"t{i}").get(30)
            prod.close()
        pid = broker.status(cfg).get("pid")
        assert pid, broker.status(cfg)
        if phase == "startup":  # the learner starts against a broker that is gone
            os.kill(pid, signal.SIGKILL)
        with open(tmp_path / "learner.log", "wb") as out:
            learner = spawn(KERNELRL + ["learner", "--idle-wait", "600"], env=cfg_env(cfg), stdout=out,
                            stderr=subprocess.STDOUT)
            if phase == "idle":  # one step done, waiting for trajectories when the broker dies
                wait_checkpoint(tmp_path / "ckpt" / "STATE.json", 1, learner, timeout=240)
                time.sleep(2.0)
                os.kill(pid, signal.SIGKILL)
            time.sleep(20.0 if phase == "startup" else 3.0)
            t0 = time.monotonic()
            learner.send_signal(signal.SIGTERM)
            try:
                learner.wait(timeout=STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"learner still running {STOP_WITHIN_S:.0f} s after SIGTERM with the broker "
                                     f"gone:\n{(tmp_path / 'learner.log').read_text()[-4000:]}") from None
            took = time.monotonic() - t0
        log_text = (tmp_path / "learner.log").read_text()
        if phase == "startup" and learner.returncode == 1:  # it may give up on its own first, saying why
            assert "cannot reach Kafka" in log_text and "Traceback" not in log_text, log_text[-3000:]
        else:
            assert learner.returncode == 0, log_text[-3000:]
        print(f"learner stopped {took:.1f} s after SIGTERM (exit {learner.returncode})")
    finally:
        broker.stop(cfg, timeout_s=10)
        shutil.rmtree(cfg.broker.state_dir, ignore_errors=True)
