"""The vLLM actor on the real broker: weight versions arrive over Kafka chunks or the learner's stream, are
verified and hot-swapped; admission control holds new episodes while the actor lags the newest announced
version; a forged announcement is given up at once and holds nothing back."""
from __future__ import annotations

import asyncio
import threading
import time

from actors.actor import Actor
from cluster.weights.stream import WeightStreamServer
from schemas import topics as T
from schemas.messages import WeightAnnouncement

from .conftest import perturbed_copy
from .helpers import relu_task
from .test_actor_process import _publish_tasks, _read_trajectories


def _announce(cfg, version, folder=None, bogus=False, stream=None, forged_offset=False):
    """Announce ``folder`` as ``version`` over Kafka chunks, or through ``stream`` (a WeightStreamServer)."""
    from cluster.bus.client import Bus
    from cluster.weights.transport import announce, publish_kafka

    with Bus(cfg, client_id="learner-test") as bus:
        prod = bus.producer()
        if stream is not None:
            ann = stream.add(cfg.learner.model_name, version, folder)
        elif bogus:  # announced, but its bytes are nowhere: must never be applied
            ann = WeightAnnouncement(model_name=cfg.learner.model_name, version=version, transport="fs",
                                     uri="/nonexistent/weights", num_chunks=1, total_bytes=1, sha256="0" * 64,
                                     files={"model.safetensors": "0" * 64})
        elif forged_offset:  # a kafka location far past the end of the chunks topic
            ann = WeightAnnouncement(model_name=cfg.learner.model_name, version=version, transport="kafka",
                                     uri=f"kafka://{T.WEIGHTS_CHUNKS}/0@999999999", num_chunks=1, total_bytes=1,
                                     sha256="0" * 64, files={"model.safetensors": "0" * 64})
        else:
            ann = publish_kafka(prod, cfg.learner.model_name, version, folder, chunk_bytes=1 << 20)
        announce(prod, ann)
        prod.close()


def _wait(pred, timeout_s=90.0, what=""):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_weights_over_kafka_hot_swap_and_admission_control(aloop, engine, tiny_model, make_cfg, tmp_path):
    cfg = make_cfg()
    a = cfg.actor
    a.workspace_root, a.weights_dir = str(tmp_path / "ws"), str(tmp_path / "weights")
    a.max_turns, a.max_new_tokens, a.max_context_tokens, a.max_version_lag = 2, 8, 16384, 1
    v = engine.version
    actor = Actor(cfg, engine, actor_id="actor-w")
    stop = asyncio.Event()
    run = asyncio.run_coroutine_threadsafe(actor.run(stop), aloop.loop)
    try:
        from cluster.weights.transport import version_dir

        stale = version_dir(a.weights_dir, cfg.learner.model_name, v + 1)  # an earlier run's v+1: other bytes
        stale.mkdir(parents=True)
        (stale / "model.safetensors").write_bytes(b"stale")
        _announce(cfg, v + 1, perturbed_copy(tiny_model, tmp_path / "v1", seed=3))
        _wait(lambda: engine.version == v + 1, what="version v+1 to be applied")
        assert actor.follower.applied[-1]["version"] == v + 1 and actor.follower.applied[-1]["swap_ms"] > 0
        _publish_tasks(cfg, [relu_task("w-task-1")])
        (t1,) = _read_trajectories(cfg, 1)
        gen = t1.loss_mask.astype(bool)
        assert gen.any() and (t1.policy_version[gen] == v + 1).all() and t1.has_logprobs
        assert t1.metadata["version_start"] == v + 1

        # forged announcements: a folder that does not exist, chunks at offsets the log does not hold. Each is
        # given up at once (no wait on chunks that will never come) and holds nothing back.
        _announce(cfg, v + 2, bogus=True)
        _announce(cfg, v + 3, forged_offset=True)
        _wait(lambda: len(actor.follower.errors) >= 2, what="the forged versions to be given up")
        assert any("is not a folder" in e for e in actor.follower.errors), actor.follower.errors
        assert any("are not in" in e and "given up" in e for e in actor.follower.errors), actor.follower.errors
        assert engine.version == v + 1 and actor.follower.lag == 0
        _publish_tasks(cfg, [relu_task("w-task-2")])
        _wait(lambda: "w-task-2" in actor.published_tasks, what="a task to run despite the forged versions")

        # a real version whose transfer is slow (held in _receive): the actor lags it by 2 > max_version_lag 1,
        # so new episodes wait until it is applied
        release, real_receive = threading.Event(), actor.follower._receive

        def slow_receive(ann):
            if ann.version == v + 4:
                release.wait(60)
            return real_receive(ann)

        actor.follower._receive = slow_receive
        _announce(cfg, v + 4, perturbed_copy(tiny_model, tmp_path / "v4", seed=4))
        _wait(lambda: actor.follower.lag == 3, what="the slow version to be pending")
        _publish_tasks(cfg, [relu_task("w-task-3")])
        time.sleep(3.0)
        assert "w-task-3" not in actor.published_tasks and actor.stats["admission_waits"] > 0
        release.set()
        _wait(lambda: "w-task-3" in actor.published_tasks, what="the held task to run after the swap")
        assert engine.version == v + 4

        # a newer version streamed by a learner-side server (transport nccl, gloo on CPU)
        stream = WeightStreamServer(tmp_path / "served", timeout_s=30)
        try:
            _announce(cfg, v + 5, tiny_model, stream=stream)
            _wait(lambda: engine.version == v + 5, what="the streamed version to be applied")
        finally:
            stream.close()
        assert actor.follower.lag == 0 and stream.served == 1
        trajs = [t for t in _read_trajectories(cfg, 3) if t.task_id == "w-task-3"]
        gen3 = trajs[0].loss_mask.astype(bool)
        assert (trajs[0].policy_version[gen3] == v + 4).all()
    finally:
        stop.set()
        run.result(60)
        actor.client.close()
        aloop.run(engine.swap_weights(tiny_model, engine.version + 1))  # leave the shared engine as found
