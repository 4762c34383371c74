"""The actor role on the real broker: concurrent episodes, commit-after-publish, crash redelivery, SIGTERM."""
from __future__ import annotations

import asyncio
import signal
import time

from actors.actor import Actor
from actors.policy import ScriptedPolicy
from actors.toolcall import format_call
from schemas import topics as T
from schemas.messages import Trajectory

from .helpers import relu_task
from .workers import signal_group
from tests.conftest import KERNELRL, cfg_env


def _script(sleep_s: float) -> list[str]:
    return [format_call("bash", {"command": f"sleep {sleep_s}; echo slept"}), format_call("finish", {})]


def _publish_tasks(cfg, tasks):
    from cluster.bus.client import Bus

    with Bus(cfg, client_id="feeder-test") as bus:
        prod = bus.producer()
        for t in tasks:
            prod.send(T.TASKS, t, key=t.task_id).get(timeout=30)
        prod.close()


def _read_trajectories(cfg, n, timeout_s=60.0) -> list[Trajectory]:
    from cluster.bus.client import Bus

    out = []
    with Bus(cfg, client_id="reader-test") as bus:
        cons = bus.consumer([T.TRAJECTORIES], f"{cfg.bus.topic_prefix}reader", expected=Trajectory)
        deadline = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < deadline:
            out += [r.msg for r in cons.poll(timeout_s=0.5)]
        time.sleep(1.0)
        out += [r.msg for r in cons.poll(timeout_s=0.5)]  # anything extra (duplicates) shows up too
        cons.close()
    return out


def _lag(cfg, group) -> int:
    """Tasks not yet committed by ``group``."""
    from cluster.bus.client import Bus

    with Bus(cfg, client_id="lag-test") as bus:
        return bus.lag(group, [T.TASKS])[T.TASKS]


def _actor_cfg(make_cfg, tmp_path, **actor):
    cfg = make_cfg()
    cfg.actor.policy = "scripted"
    cfg.actor.workspace_root = str(tmp_path / "ws")
    cfg.actor.max_turns = 10
    for k, v in actor.items():
        setattr(cfg.actor, k, v)
    return cfg


def test_concurrent_episodes_commit_only_after_publish(aloop, tokenizer, make_cfg, tmp_path):
    cfg = _actor_cfg(make_cfg, tmp_path, concurrency=3)
    # first task slowest: later tasks of its partition finish first, yet nothing passes it uncommitted
    tasks = [relu_task(f"task-{i}", scripted_turns=_script(s)) for i, s in enumerate([2.0, 0.1, 0.2, 0.1, 0.3])]
    _publish_tasks(cfg, tasks)
    actor = Actor(cfg, ScriptedPolicy(tokenizer, []), actor_id="actor-c")
    stop = asyncio.Event()
    t0 = time.monotonic()
    n = aloop.run(actor.run(stop, max_episodes=5), timeout=40)
    elapsed = time.monotonic() - t0
    assert n == 5 and actor.stats["published"] == 5 and actor.stats["errors"] == 0
    assert elapsed < 2.0 + 0.1 + 0.2 + 0.1 + 0.3 + 8  # ran concurrently, not one after another
    trajs = _read_trajectories(cfg, 5)
    assert sorted(t.task_id for t in trajs) == sorted(t.task_id for t in tasks)
    assert all(t.end_reason == "finish" and t.actor_id == "actor-c" for t in trajs)
    assert _lag(cfg, f"{cfg.bus.topic_prefix}actors") == 0
    actor.client.close()


def test_actor_killed_mid_episode_loses_no_task(aloop, tokenizer, tiny_model, make_cfg, spawn, tmp_path):
    cfg = _actor_cfg(make_cfg, tmp_path, concurrency=1)
    _publish_tasks(cfg, [relu_task("crash-task", scripted_turns=_script(4.0))])
    log = open(tmp_path / "actor-a.log", "wb")  # noqa: SIM115 - the child process writes it
    a = spawn(KERNELRL + ["-v", "actor", "--id", "actor-a", "--model", tiny_model], env=cfg_env(cfg),
              stdout=log, stderr=log)
    ws = tmp_path / "ws"
    deadline = time.monotonic() + 120
    while not (ws.is_dir() and any(ws.iterdir())):  # actor A is inside the episode
        assert a.poll() is None, (tmp_path / "actor-a.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "actor A never started the episode"
        time.sleep(0.05)
    time.sleep(0.5)
    signal_group(a, signal.SIGKILL)
    a.wait(10)
    actor_b = Actor(cfg, ScriptedPolicy(tokenizer, []), actor_id="actor-b")
    n = aloop.run(actor_b.run(asyncio.Event(), max_episodes=1), timeout=120)
    assert n == 1
    trajs = _read_trajectories(cfg, 1)
    assert [(t.task_id, t.actor_id, t.end_reason) for t in trajs] == [("crash-task", "actor-b", "finish")]
    assert _lag(cfg, f"{cfg.bus.topic_prefix}actors") == 0
    actor_b.client.close()


def test_sigterm_finishes_within_grace_and_leaves_the_rest_uncommitted(tokenizer, tiny_model, make_cfg, spawn,
                                                                        tmp_path):
    from cluster.bus.client import Bus

    cfg = _actor_cfg(make_cfg, tmp_path, concurrency=2, shutdown_grace_s=4.0)
    with Bus(cfg, client_id="feeder-test") as bus:
        prod = bus.producer()
        prod.send(T.TASKS, relu_task("long", scripted_turns=_script(60)), key="long", partition=0).get(timeout=30)
        prod.send(T.TASKS, relu_task("short", scripted_turns=_script(1.5)), key="short", partition=1).get(timeout=30)
        prod.close()
    log = open(tmp_path / "actor.log", "wb")  # noqa: SIM115 - the child process writes it
    a = spawn(KERNELRL + ["-v", "actor", "--id", "actor-t", "--model", tiny_model], env=cfg_env(cfg),
              stdout=log, stderr=log)
    ws = tmp_path / "ws"
    deadline = time.monotonic() + 120
    while not (ws.is_dir() and len(list(ws.iterdir())) == 2):  # both episodes are running
        assert a.poll() is None and time.monotonic() < deadline, (tmp_path / "actor.log").read_text()[-3000:]
        time.sleep(0.05)
    a.send_signal(signal.SIGTERM)
    assert a.wait(30) == 0
    trajs = _read_trajectories(cfg, 1, timeout_s=10)
    assert [t.task_id for t in trajs] == ["short"]  # finished within the grace period: published
    assert _lag(cfg, f"{cfg.bus.topic_prefix}actors") == 1  # the cancelled one stays uncommitted
    assert not any(ws.iterdir())  # workspaces cleaned up


class DeadEnginePolicy(ScriptedPolicy):
    """Raises vLLM's own EngineDeadError, as the real engine does when its process dies."""

    async def generate(self, req):
        from vllm.v1.engine.exceptions import EngineDeadError

        raise EngineDeadError("EngineCore encountered an issue")


def test_dead_engine_stops_the_actor_without_committing(aloop, tokenizer, make_cfg, tmp_path):
    from actors.agent import PolicyFailure

    cfg = _actor_cfg(make_cfg, tmp_path)
    _publish_tasks(cfg, [relu_task("dead-engine")])
    actor = Actor(cfg, DeadEnginePolicy(tokenizer, []), actor_id="actor-d")
    try:
        aloop.run(actor.run(asyncio.Event()), timeout=60)
        raise AssertionError("the actor should have stopped with PolicyFailure")
    except PolicyFailure:
        pass
    finally:
        actor.client.close()
    assert actor.stats["published"] == 0
    assert _lag(cfg, f"{cfg.bus.topic_prefix}actors") == 1  # the task waits for a healthy actor


def test_vllm_actor_sigterm_to_its_process_group(tiny_model, make_cfg, spawn, tmp_path):
    """The supervisor's SIGTERM reaches vLLM's engine processes too: the cut episode stays uncommitted."""
    cfg = _actor_cfg(make_cfg, tmp_path, policy="vllm", max_turns=500, max_new_tokens=64, max_context_tokens=16384,
                     kv_cache_mb=64)
    _publish_tasks(cfg, [relu_task("long-vllm")])
    log = open(tmp_path / "actor.log", "wb")  # noqa: SIM115 - the child process writes it
    a = spawn(KERNELRL + ["-v", "actor", "--id", "actor-v", "--model", tiny_model], env=cfg_env(cfg),
              stdout=log, stderr=log)
    ws = tmp_path / "ws"
    deadline = time.monotonic() + 180
    while not (ws.is_dir() and any(ws.iterdir())):
        assert a.poll() is None and time.monotonic() < deadline, (tmp_path / "actor.log").read_text()[-3000:]
        time.sleep(0.1)
    time.sleep(1.0)
    signal_group(a, signal.SIGTERM)
    assert a.wait(60) == 0, (tmp_path / "actor.log").read_text()[-3000:]
    assert _lag(cfg, f"{cfg.bus.topic_prefix}actors") == 1
    assert _read_trajectories(cfg, 1, timeout_s=2) == []


def test_tasks_an_episode_cannot_start_are_dead_lettered_and_committed(aloop, tokenizer, make_cfg, tmp_path):
    """A task that decodes but cannot be rolled out (unknown backend, no reference Model, a script that is not
    a list of turns) gets one dead letter with its reason; the valid tasks around it run, and every offset of
    the partition is committed (none is left neither trained, dead-lettered nor answered)."""
    from cluster.bus.client import Bus
    from tests.backbone.test_bus import dead_letters

    cfg = _actor_cfg(make_cfg, tmp_path, concurrency=2)
    good = [relu_task("ok-1", scripted_turns=_script(0.1)), relu_task("ok-2", scripted_turns=_script(0.1))]
    bad = [relu_task("bad-backend", scripted_turns=_script(0.1)), relu_task("bad-model"),
           relu_task("bad-script", scripted_turns="rm -rf /")]
    bad[0].backend, bad[1].model_py = "quantum", "import torch\n"
    with Bus(cfg, client_id="feeder-test") as bus:
        prod = bus.producer()
        for t in [good[0], *bad, good[1]]:  # one partition: the bad ones sit between the good ones
            prod.send(T.TASKS, t, key=t.task_id, partition=0).get(timeout=30)
        prod.close()
    actor = Actor(cfg, ScriptedPolicy(tokenizer, []), actor_id="actor-v")
    assert aloop.run(actor.run(asyncio.Event(), max_episodes=2), timeout=60) == 2
    assert sorted(t.task_id for t in _read_trajectories(cfg, 2)) == ["ok-1", "ok-2"]
    assert _lag(cfg, f"{cfg.bus.topic_prefix}actors") == 0
    with Bus(cfg, client_id="dlq-test") as bus:
        letters = dead_letters(bus, 3)
    why = {codec_task_id(d.payload): d.error for d in letters}
    assert set(why) == {"bad-backend", "bad-model", "bad-script"}, why
    assert "backend 'quantum'" in why["bad-backend"] and "class Model" in why["bad-model"]
    assert "scripted_turns" in why["bad-script"] and all(e.startswith("task refused:") for e in why.values())
    assert all(d.source_topic.endswith(T.TASKS) and d.partition == 0 for d in letters)
    actor.client.close()


def codec_task_id(payload: bytes) -> str:
    from schemas import codec

    return codec.decode(payload).task_id


def _limit_topic_bytes(cfg, topic: str, max_bytes: int) -> None:
    """Make the broker refuse records of ``topic`` above ``max_bytes`` (its max.message.bytes)."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    from cluster.bus.clients import admin_kwargs

    admin = KafkaAdminClient(**admin_kwargs(cfg, "limit-test", cfg.bus.bootstrap_servers))
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, cfg.bus.topic_prefix + topic,
                                            configs={"max.message.bytes": str(max_bytes)})])
    finally:
        admin.close()


def test_trajectory_too_large_for_the_broker_is_dead_lettered_and_the_partition_moves_on(
        aloop, tokenizer, make_cfg, tmp_path):
    from cluster.bus.client import Bus
    from cluster.bus.scan import committed_offsets
    from tests.backbone.test_bus import dead_letters

    cfg = _actor_cfg(make_cfg, tmp_path, concurrency=1, max_observation_chars=150_000)
    _limit_topic_bytes(cfg, T.TRAJECTORIES, 300_000)
    noise = format_call("bash", {"command": "head -c 90000 /dev/urandom | base64 -w0"})  # ~120k chars, incompressible
    big = relu_task("task-big", scripted_turns=[noise, format_call("finish", {})])
    small = relu_task("task-small", scripted_turns=[format_call("finish", {})])
    with Bus(cfg, client_id="feeder-test") as bus:
        prod = bus.producer()
        for t in (big, small):  # one partition: the small task's commit must not wait behind the big one
            prod.send(T.TASKS, t, key=t.task_id, partition=0).get(timeout=30)
        prod.close()
    actor = Actor(cfg, ScriptedPolicy(tokenizer, []), actor_id="actor-big")
    t0 = time.monotonic()
    try:
        n = aloop.run(actor.run(asyncio.Event(), max_episodes=1), timeout=60)
    finally:
        actor.close()
    elapsed = time.monotonic() - t0
    assert n == 1 and actor.stats["refused"] == 1 and actor.stats["publish_failures"] == 1  # tried once, not 5 times
    assert elapsed < 20, f"{elapsed:.1f} s: the refused trajectory was retried"
    assert [t.task_id for t in _read_trajectories(cfg, 1)] == ["task-small"]
    with Bus(cfg, client_id="dlq-test") as bus:
        letters = dead_letters(bus, 1)
        deadline = time.monotonic() + 20
        while committed_offsets(bus, bus.group("actors"), T.TASKS).get(0) != 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert committed_offsets(bus, bus.group("actors"), T.TASKS).get(0) == 2  # past both tasks
    assert len(letters) == 1 and letters[0].offset == 0
    assert "MessageSizeTooLargeError" in letters[0].error and "trajectory unpublishable" in letters[0].error
