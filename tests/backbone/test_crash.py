"""Crashes lose nothing: a SIGKILLed consumer's uncommitted records are redelivered, and a
producer's buffered messages survive a broker stop/start."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from cluster.broker import embedded as broker
from cluster.bus import topics_admin
from cluster.bus.client import Bus
from cluster.config import Config
from schemas import topics as T
from schemas.messages import Task
from tests.backbone.test_bus import _wait, drain
from tests.conftest import ROOT, cfg_env


def _lines(path: Path, prefix: str) -> list[str]:
    text = path.read_text() if path.exists() else ""
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith(prefix + " ")]


def test_consumer_killed_mid_batch_loses_nothing(cfg, spawn, tmp_path):
    n = 30
    bus = Bus(cfg, client_id="crash")
    prod = bus.producer()
    for i in range(n):
        prod.send(T.TASKS, Task(task_id=f"t{i}", model_py="m"), key=f"k{i}")
    prod.flush(30)
    log = tmp_path / "child.log"
    child = spawn([sys.executable, str(ROOT / "tests/backbone/consumer_child.py"), "crashers", str(log)],
                  env=cfg_env(cfg))
    _wait(lambda: len(_lines(log, "done")) >= 5 or child.poll() is not None, 60, "child to finish 5 records")
    assert child.poll() is None, f"child exited early: {log.read_text()}"
    os.killpg(child.pid, signal.SIGKILL)  # mid-batch: it has polled more than it has done
    child.wait(10)
    done, polled = _lines(log, "done"), _lines(log, "polled")
    assert len(polled) > len(done)
    cons = bus.consumer([T.TASKS], group_id="crashers")  # gets the partitions once the dead member expires
    rest = drain(cons, n - len(done), timeout_s=60)
    cons.close()
    prod.close()
    again = [r.msg.task_id for r in rest]
    assert set(done) | set(again) == {f"t{i}" for i in range(n)}  # nothing lost
    assert set(polled) - set(done) <= set(again)  # polled but unfinished work came back
    assert len(set(done) & set(again)) <= 1  # at most the one whose commit raced the kill
    assert bus.lag("crashers", [T.TASKS]) == {T.TASKS: 0}
    bus.close()


def test_buffered_messages_are_delivered_after_broker_restart(kafka):
    cfg = Config()
    cfg.broker.state_dir = tempfile.mkdtemp(prefix="krl-test-restart-")
    cfg.bus.topic_prefix = "restart."
    cfg.topics.partitions = 1
    try:
        st = broker.start(cfg, tie_to_parent=True)
        cfg.bus.bootstrap_servers = st["bootstrap"]
        topics_admin.create_all(cfg)
        bus = Bus(cfg, client_id="restart")
        prod = bus.producer()
        for i in range(5):
            prod.send(T.TASKS, Task(task_id=f"before{i}", model_py="m")).get(30)
        assert broker.stop(cfg, timeout_s=20)["clean"]
        futures = [prod.send(T.TASKS, Task(task_id=f"during{i}", model_py="m")) for i in range(10)]
        time.sleep(1.0)
        assert not any(f.inner.is_done for f in futures)  # buffered: nowhere to go
        st2 = broker.start(cfg, tie_to_parent=True)
        assert st2["bootstrap"] == st["bootstrap"]  # same ports: clients reconnect by themselves
        prod.flush(60)
        assert all(f.get(1).topic == cfg.topic(T.TASKS) for f in futures)
        cons = bus.consumer([T.TASKS], group_id="after-restart")
        ids = [r.msg.task_id for r in drain(cons, 15, 30)]
        cons.close()
        prod.close()
        bus.close()
        assert ids == [f"before{i}" for i in range(5)] + [f"during{i}" for i in range(10)]
    finally:
        broker.stop(cfg, timeout_s=20)
        import shutil
        shutil.rmtree(cfg.broker.state_dir, ignore_errors=True)
