"""The pieces of `kernelrl bench weights`: the model under test, baselines, an engine, one timed run per transport.

Each ``run_<transport>(cfg, bus, engine, folder, state, tmp)`` moves one new version of ``state`` (the
policy's tensors, in memory) from the learner's side to the engine and returns its stage times in
seconds; ``engine`` may be None (no swap is timed then). ``run_delta`` moves a realistic successor of
``state`` instead (an Adam-like step), since a delta's size depends on how much the weights moved.
"""
from __future__ import annotations

import asyncio
import itertools
import re
import shutil
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np

_versions = itertools.count(1)
MODEL_NAME = "bench-policy"


# ---- the model ----------------------------------------------------------------------------
def _random_model(dst: Path, params_m: int, tiny: str) -> None:
    """A random float32 Qwen2 of about ``params_m`` million parameters (hidden 1024, tied embeddings) with
    the tiny model's tokenizer files, so a vLLM engine can serve it."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    vocab, hidden, inter = 32000, 1024, 2816
    per_layer = 2 * hidden * hidden + 2 * hidden * 256 + 3 * hidden * inter  # q,o + k,v (4 kv heads of 64) + MLP
    layers = max(1, round((params_m * 1e6 - vocab * hidden) / per_layer))
    torch.manual_seed(0)
    conf = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True,
                       max_position_embeddings=4096)
    Qwen2ForCausalLM(conf).to(torch.float32).save_pretrained(str(dst), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(tiny) / name).exists():
            shutil.copyfile(Path(tiny) / name, dst / name)


def model_folder(spec: str, cfg, tmp: Path):
    """(folder, tensors by name in memory, bytes, parameters) of ``spec``: random-<N>m, tiny or a folder."""
    from cluster.models.tiny import build_tiny_model, default_tiny_model_dir
    from cluster.weights.buckets import folder_tensors

    tiny = build_tiny_model(default_tiny_model_dir(cfg))
    m = re.fullmatch(r"random-(\d+)m", spec)
    if m:
        folder = tmp / spec
        _random_model(folder, int(m[1]), tiny)
    elif spec == "tiny":
        folder = Path(tiny)
    else:
        from cluster.models.importer import resolve_model_path

        folder = Path(resolve_model_path(cfg, spec))
    state = {k: v.contiguous() for k, v in folder_tensors(folder)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    return folder, state, nbytes, sum(t.numel() for t in state.values())


# ---- baselines ----------------------------------------------------------------------------


def kafka_raw(cfg, nbytes: int, chunk: int) -> dict:
    """Plain kafka-python: produce ``nbytes`` random bytes in ``chunk``-sized messages, then consume them."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    from cluster.bus.clients import connection_kwargs, consumer_kwargs, producer_kwargs

    topic = f"{cfg.bus.topic_prefix}bench.raw"
    admin = KafkaAdminClient(**connection_kwargs(cfg, "bench-raw-admin"))
    limit = str(cfg.topics.weights_max_message_bytes + (1 << 20))
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": limit})])
    admin.close()
    data = memoryview(np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8).tobytes())
    prod = KafkaProducer(**producer_kwargs(cfg, "bench-raw"))
    t0 = time.perf_counter()
    for off in range(0, nbytes, chunk):
        prod.send(topic, bytes(data[off:off + chunk]))
    prod.flush()
    t1 = time.perf_counter()
    prod.close()
    cons = KafkaConsumer(**consumer_kwargs(cfg, "bench-raw-c", None))
    tp = TopicPartition(topic, 0)
    cons.assign([tp])
    cons.seek_to_beginning(tp)
    got, t2 = 0, time.perf_counter()
    while got < nbytes:
        for recs in cons.poll(timeout_ms=500).values():
            got += sum(len(r.value) for r in recs)
        if time.perf_counter() - t2 > 600:
            raise TimeoutError(f"kafka raw: {got}/{nbytes} bytes consumed in 600 s")
    t3 = time.perf_counter()
    cons.close()
    return {"produce_s": round(t1 - t0, 4), "consume_s": round(t3 - t2, 4),
            "gb_s": round(nbytes / (t1 - t0 + t3 - t2) / 1e9, 4)}


# ---- the engine ---------------------------------------------------------------------------
class EngineThread:
    """A VLLMPolicy on an event loop of its own thread (as in an actor: swaps while the loop runs)."""

    def __init__(self, model_path: str, cfg) -> None:
        import copy

        from actors.policy_vllm import VLLMPolicy

        acfg = copy.copy(cfg.actor)
        acfg.max_context_tokens, acfg.kv_cache_mb = 2048, max(64, acfg.kv_cache_mb)  # a real model needs more
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="bench-engine", daemon=True)
        self.thread.start()
        self.policy = self.run(VLLMPolicy.start(model_path, acfg))

    def run(self, coro, timeout: float = 900.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.run(self.policy.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


# ---- one version per transport ------------------------------------------------------------
def _export(state: dict, folder: Path, out: Path) -> Path:
    """What a learner writes for the disk transports: the tensors as safetensors plus the folder's other files."""
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    for p in folder.iterdir():
        if p.is_file() and p.suffix != ".safetensors":
            shutil.copyfile(p, out / p.name)
    return out


def _timed(stages: dict, name: str, fn, *a):
    t = time.perf_counter()
    out = fn(*a)
    stages[name] = time.perf_counter() - t
    return out


def run_fs(cfg, bus, engine, folder, state, tmp: Path) -> dict:
    from cluster.weights import transport as wt

    v, st = next(_versions), {}
    export = _timed(st, "export_s", _export, state, folder, tmp / f"export-{v}")
    prod = bus.producer()
    try:
        t = time.perf_counter()
        ann = wt.publish_fs(tmp / "fs", MODEL_NAME, v, export, take=True, sync=False)  # as the learner does
        wt.announce(prod, ann)
        st["publish_s"] = time.perf_counter() - t
    finally:
        prod.close()
    got = _timed(st, "receive_s", wt.receive, None, ann, tmp / "actor")
    if engine is not None:
        _timed(st, "swap_s", engine.run, engine.policy.swap_weights(str(got), v))
    wt.wait_durable()  # the version's fsync, off the clock as off the learner's path: not left to the next run
    shutil.rmtree(export)
    shutil.rmtree(got)
    return st


def run_nccl(cfg, bus, engine, folder, state, tmp: Path) -> dict:
    """The ``nccl`` transport as the learner uses it: exported beside the stream server's versions, added with
    ``take`` (linked, hashed, synced off the clock) and announced; one actor process receives it over a process
    group (gloo on the CPU machine, NCCL between GPUs); vLLM reloads the received folder."""
    from cluster.weights import fs as wfs
    from cluster.weights import stream as ws
    from cluster.weights import transport as wt
    from cluster.weights.bench_stream import receive_one

    v, st = next(_versions), {}
    root, got = tmp / "nccl", tmp / f"actor-nccl-{v}"
    server = ws.WeightStreamServer(root, backend=cfg.learner.weight_stream_backend,
                                   chunk_bytes=cfg.learner.chunk_bytes, timeout_s=600, gather_s=0.0)
    prod = bus.producer()
    try:
        export = _timed(st, "export_s", _export, state, folder, root / MODEL_NAME / f"{wt.EXPORT_PREFIX}{v}")
        t = time.perf_counter()
        ann = server.add(MODEL_NAME, v, export, take=True)
        wt.announce(prod, ann)
        st["publish_s"] = time.perf_counter() - t
        st["receive_s"] = receive_one(ann, got)
        if engine is not None:  # the receiver put it where an actor's receive does
            _timed(st, "swap_s", engine.run, engine.policy.swap_weights(str(wfs.version_dir(got, MODEL_NAME, v)), v))
        wt.wait_durable()
    finally:
        prod.close()
        server.close()
        shutil.rmtree(got, ignore_errors=True)
    return st


def run_kafka(cfg, bus, engine, folder, state, tmp: Path) -> dict:
    from cluster.weights import transport as wt

    v, st = next(_versions), {}
    export = _timed(st, "export_s", _export, state, folder, tmp / f"export-{v}")
    prod = bus.producer()
    try:
        t = time.perf_counter()
        ann = wt.publish_kafka(prod, MODEL_NAME, v, export, cfg.learner.chunk_bytes)
        wt.announce(prod, ann)
        st["publish_s"] = time.perf_counter() - t
    finally:
        prod.close()
    got = _timed(st, "receive_s", wt.receive, bus, ann, tmp / "actor", 600.0)
    if engine is not None:
        _timed(st, "swap_s", engine.run, engine.policy.swap_weights(str(got), v))
    shutil.rmtree(export)
    shutil.rmtree(got)
    return st


def run_memory(cfg, bus, engine, folder, state, tmp: Path) -> dict:
    from cluster.weights import buckets as wb
    from cluster.weights import transport as wt

    v, st, lc = next(_versions), {}, cfg.learner
    prod = bus.producer()
    try:
        t = time.perf_counter()
        ann = wb.publish_kafka_buckets(prod, MODEL_NAME, v, wb.pack(state.items(), lc.weight_bucket_bytes),
                                       lc.chunk_bytes)
        wt.announce(prod, ann)
        st["publish_s"] = time.perf_counter() - t
    finally:
        prod.close()
    key = f"{MODEL_NAME}:{v}"
    _timed(st, "receive_s", wb.receive_pipelined, bus, ann, _submitter(engine, key), 600.0)
    if engine is not None:
        _timed(st, "swap_s", engine.run, engine.policy.swap_staged(key, len(ann.buckets), v))
    return st


def adam_step(master: dict, lr: float, seed: int, like: dict) -> dict:
    """The next version of the policy: each float32 master weight moved by an Adam-like step (about ``lr``,
    either sign: Adam's m / sqrt(v) is near +-1), stored in the dtype of ``like``'s tensors."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, w in master.items():
        if not w.is_floating_point():
            out[k] = like[k]
            continue
        step = torch.rand(w.shape, generator=g).mul_(0.9).add_(0.1).mul_(lr)
        step.mul_(torch.randint(0, 2, w.shape, generator=g).mul_(2).sub_(1))
        out[k] = (w.float() + step).to(like[k].dtype).contiguous()
    return out


def run_delta(cfg, bus, engine, folder, state, tmp: Path, master: dict | None = None, lr: float = 1e-5) -> dict:
    """``run_memory`` with learner.weight_compression = "xor-delta": a base version is published and received
    untimed (both sides then hold it), then its successor (one ``adam_step`` of ``master``) is timed, read by
    the receiver from its delta section. Also returns ``compression_ratio`` (raw bytes / delta bytes)."""
    from cluster.weights import buckets as wb
    from cluster.weights import transport as wt
    from cluster.weights.codec import DeltaEncoder

    lc, enc, held = cfg.learner, DeltaEncoder(), wb.HeldBuckets()
    base_v = next(_versions)
    prod = bus.producer()
    try:
        base = wb.publish_kafka_buckets(prod, MODEL_NAME, base_v, wb.pack(state.items(), lc.weight_bucket_bytes),
                                        lc.chunk_bytes, delta=enc)
        wt.announce(prod, base)
        wb.receive_buckets(bus, base, lambda i, data: None, 600.0, held=held)
        new = adam_step(master if master is not None else state, lr, base_v, state)
        v, st = next(_versions), {}
        t = time.perf_counter()
        ann = wb.publish_kafka_buckets(prod, MODEL_NAME, v, wb.pack(new.items(), lc.weight_bucket_bytes),
                                       lc.chunk_bytes, delta=enc)
        wt.announce(prod, ann)
        st["publish_s"] = time.perf_counter() - t
    finally:
        prod.close()
    if not held.can_decode(ann):
        raise RuntimeError(f"bench delta: v{v} cannot be decoded against the held v{held.version}")
    key = f"{MODEL_NAME}:{v}"
    _timed(st, "receive_s", wb.receive_pipelined, bus, ann, _submitter(engine, key), 600.0, None, held)
    if engine is not None:
        _timed(st, "swap_s", engine.run, engine.policy.swap_staged(key, len(ann.buckets), v))
    st["compression_ratio"] = wb.wire_ratio(ann)
    return st


def _submitter(engine, key: str):
    """What the actor does with each verified bucket while the next arrives: stage it in the engine (or, with
    no engine, parse it into tensors)."""
    from cluster.weights import buckets as wb

    def submit(i: int, data: bytes):
        if engine is not None:
            return asyncio.run_coroutine_threadsafe(engine.policy.stage_bucket(key, i, data), engine.loop)
        done: Future = Future()
        done.set_result(wb.tensors_of(data))
        return done

    return submit
