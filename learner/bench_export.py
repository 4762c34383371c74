"""`kernelrl bench learner export=0.5b,1.5b`: the learner's bucket export against the device-to-host copy rate.

For each model (a randomly initialised Qwen2 of Qwen2.5-0.5B or -1.5B shapes, built on the learner's device in
``learner.dtype``; ``tiny`` is the test model): ``d2h_gb_s`` is one contiguous device buffer of the model's bytes
copied into pinned host memory (the link's rate, best of ``reps``); ``export_gb_s`` is
learner/export_buckets.py filling its two host slots bucket by bucket with the model's tensors as safetensors
(what an in-memory publish hands to the transport; best of ``reps`` after a first export that allocates the
slots, reported as ``first_export_s``); ``ratio = export_gb_s / d2h_gb_s``. ``export_hash_gb_s`` is the same with
each bucket hashed as the Kafka transport does (overlapping the next bucket's copies), per algorithm: ``digest``
(blake3, what the publisher uses, on every core) and sha256 (what versions carried before) for comparison;
``state_dict_pack_gb_s`` is the path it replaced (the whole state dict copied to host, then serialised by
safetensors), measured in the same run.
"""
from __future__ import annotations

import logging
import time

from cluster.weights import digest

log = logging.getLogger(__name__)

QWEN05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
               num_attention_heads=14, num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)
QWEN15B = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
               num_attention_heads=12, num_key_value_heads=2, head_dim=128, tie_word_embeddings=True)


def build_module(size: str, tiny: str, device, dtype):
    """A model of the named size on ``device`` (random weights, built there: no host round trip)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if size == "tiny":
        return AutoModelForCausalLM.from_pretrained(tiny, dtype=dtype).to(device)
    shapes = {"0.5b": QWEN05B, "1.5b": QWEN15B}.get(size)
    if shapes is None:
        from cluster.errors import InputError

        raise InputError(f"export={size}: expected tiny, 0.5b or 1.5b")
    torch.manual_seed(0)
    with torch.device(device):
        return Qwen2ForCausalLM(Qwen2Config(**shapes, max_position_embeddings=32768)).to(dtype)


def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize()


def d2h_gb_s(nbytes: int, device, reps: int = 3) -> float:
    """One contiguous copy of ``nbytes`` from the device into pinned host memory (a memcpy on CPU)."""
    import torch

    on_cuda = getattr(device, "type", str(device)) == "cuda"
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=on_cuda)
    best = float("inf")
    for _ in range(reps + 1):  # the first copy maps the pages
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src, non_blocking=on_cuda)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    del src, dst
    return nbytes / best / 1e9


def _timed_export(ex, module, alg: str | None = None) -> float:
    """Seconds of one export, each bucket hashed by ``alg`` (None: not hashed)."""
    t = time.perf_counter()
    for view in ex.buckets(module):
        if alg is not None:
            digest.hexdigest(alg, view)
    return time.perf_counter() - t


def _timed_state_dict_pack(module, bucket_bytes: int) -> tuple[float, int]:
    from cluster.weights.buckets import pack
    from learner.export_buckets import tied_keys

    t = time.perf_counter()
    tied = tied_keys(module)
    sd = sorted((k, v.detach().cpu()) for k, v in module.state_dict().items() if k not in tied)
    n = sum(len(b) for b in pack(sd, bucket_bytes))
    return time.perf_counter() - t, n


def one(size: str, tiny: str, device, dtype, bucket_bytes: int, reps: int) -> dict:
    from learner.export_buckets import BucketExporter

    t = time.perf_counter()
    module = build_module(size, tiny, device, dtype)
    _sync(device)
    built_s = time.perf_counter() - t
    ex = BucketExporter(bucket_bytes)
    first = _timed_export(ex, module)
    nbytes, nbuckets = ex.stats["bytes"], ex.stats["buckets"]
    export_s = min(_timed_export(ex, module) for _ in range(reps))
    hash_s = {alg: min(_timed_export(ex, module, alg) for _ in range(reps)) for alg in (digest.DEFAULT, digest.SHA256)}
    pack_s, pack_bytes = min(_timed_state_dict_pack(module, bucket_bytes) for _ in range(max(1, reps - 1)))
    link = d2h_gb_s(nbytes, device, reps)
    out = {"model": f"random-{size}" if size != "tiny" else "tiny", "params": sum(p.numel() for p in module.parameters()),
           "bytes": nbytes, "buckets": nbuckets, "bucket_bytes": bucket_bytes, "build_s": built_s,
           "first_export_s": first, "export_s": export_s, "export_gb_s": nbytes / export_s / 1e9,
           "d2h_gb_s": link, "digest": digest.DEFAULT,
           "export_hash_gb_s": {alg: nbytes / s / 1e9 for alg, s in hash_s.items()},
           "state_dict_pack_s": pack_s, "state_dict_pack_gb_s": pack_bytes / pack_s / 1e9}
    out["ratio"] = out["export_gb_s"] / link
    out["state_dict_pack_ratio"] = out["state_dict_pack_gb_s"] / link
    log.info("export %s: %.2f GB/s vs device-to-host %.2f GB/s (%.2fx); hashed %s; state dict + pack %.2f GB/s",
             size, out["export_gb_s"], link, out["ratio"], out["export_hash_gb_s"], out["state_dict_pack_gb_s"])
    del module, ex
    return out


def run(cfg, sizes: list[str], tiny: str, reps: int = 3) -> dict:
    import torch

    from learner import engine as eng

    dtype = torch.bfloat16 if cfg.learner.dtype == "bf16" else torch.float32
    device = eng.device()
    models = []
    for size in sizes:
        models.append(one(size, tiny, device, dtype, cfg.learner.weight_bucket_bytes, reps))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return {"bench": "export", "device": "cuda" if eng.on_gpu() else "cpu", "dtype": cfg.learner.dtype,
            "models": models}
