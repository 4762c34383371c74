"""The vLLM policy backend: an in-process AsyncLLM that also takes weight hot-swaps.

Tokens go in and come out as ids; each generated token carries the engine's
log-prob of it and the policy version of the weights that sampled it (vLLM's
per-request weight-version spans, fed by ``update_weight_version``).
CPU facts (REFERENCE.md section 4): float32, enforce_eager, explicit KV-cache
size, TORCH_COMPILE_DISABLE=1; the engine core runs in a spawned process, so
callers need a ``__main__`` guard.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from actors.policy_api import GenRequest, Generation, decode_pair

log = logging.getLogger(__name__)


def _cpu_only() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


def engine_args(model_path: str, acfg: Any, *, max_model_len: int | None = None) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs

    cpu = _cpu_only()
    model_max = _model_max_len(model_path)
    mml = min(max_model_len or acfg.max_context_tokens, model_max) if model_max else \
        (max_model_len or acfg.max_context_tokens)
    kw: dict[str, Any] = dict(model=model_path, seed=acfg.seed, max_model_len=mml, disable_log_stats=True,
                              enable_prefix_caching=True,
                              worker_extension_cls="actors.vllm_worker_ext.KrlWorkerExtension",
                              # one engine over several GPUs (or CPU worker processes); `kernelrl up` gives
                              # the actor that many GPUs through CUDA_VISIBLE_DEVICES
                              tensor_parallel_size=getattr(acfg, "tensor_parallel_size", 1),
                              pipeline_parallel_size=getattr(acfg, "pipeline_parallel_size", 1))
    if cpu:
        kw.update(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=acfg.kv_cache_mb << 20)
    else:
        kw.update(dtype=acfg.dtype or "auto", gpu_memory_utilization=acfg.gpu_memory_utilization)
    return AsyncEngineArgs(**kw)


def cpu_worker_binding(world: int) -> str | None:
    """vLLM-CPU runs one worker process per tensor/pipeline part and binds each to CPUs of a NUMA node of its own
    ("auto"), refusing when the machine has fewer nodes than parts. There, unless VLLM_CPU_OMP_THREADS_BIND is set,
    the cores this process may use are split between the workers instead ("0|1": worker 0 on core 0, ...);
    None = leave vLLM's binding alone."""
    if world <= 1 or os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto") != "auto":
        return None
    numa_nodes = len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))
    if numa_nodes >= world:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < world:
        from cluster.errors import SetupError

        raise SetupError(f"actor.tensor_parallel_size x actor.pipeline_parallel_size = {world}: vLLM's CPU backend "
                         f"runs a worker per part, each on cores of its own, and this process may use "
                         f"{len(cores)} core(s) (or set VLLM_CPU_OMP_THREADS_BIND)")
    share = len(cores) // world
    mask = "|".join(",".join(map(str, cores[i * share:(i + 1) * share])) for i in range(world))
    log.info("vLLM CPU workers bound to cores %s (%d NUMA node(s) for %d parts)", mask, numa_nodes, world)
    return mask


def _model_max_len(model_path: str) -> int:
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(cfg.get("max_position_embeddings") or 0)


class VLLMPolicy:
    """AsyncLLM wrapper: token-exact generation, versions per token, hot-swap."""

    name = "vllm"
    has_logprobs = True
    trainable = True

    def __init__(self, llm: Any, tokenizer: Any, acfg: Any, version: int):
        self.llm = llm
        self.tokenizer = tokenizer
        self.acfg = acfg
        self._version = version
        self._swap_lock = asyncio.Lock()
        self.swaps: list[dict] = []

    @classmethod
    async def start(cls, model_path: str, acfg: Any, *, version: int = 0,
                    max_model_len: int | None = None) -> "VLLMPolicy":
        os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout stays the CLI's (--json)
        from vllm.v1.engine.async_llm import AsyncLLM

        from actors.policy_api import load_tokenizer

        t0 = time.monotonic()
        args = engine_args(model_path, acfg, max_model_len=max_model_len)
        mask = cpu_worker_binding(args.tensor_parallel_size * args.pipeline_parallel_size) if _cpu_only() else None
        if mask is not None:  # read by the engine process spawned now; not left behind for a later engine
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = mask
        try:
            llm = AsyncLLM.from_engine_args(args)
        finally:
            if mask is not None:
                os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        await llm.update_weight_version(str(version))
        log.info("vLLM engine for %s up in %.1f s", model_path, time.monotonic() - t0)
        return cls(llm, load_tokenizer(model_path), acfg, version)

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_model_len(self) -> int:
        return int(self.llm.model_config.max_model_len)

    def sampling_params(self, max_tokens: int, temperature: float | None = None, seed: int | None = None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(max_tokens=max_tokens, logprobs=0, detokenize=False, seed=seed,
                              temperature=self.acfg.temperature if temperature is None else temperature,
                              top_p=1.0, output_kind=RequestOutputKind.FINAL_ONLY)

    async def generate(self, req: GenRequest, *, temperature: float | None = None,
                       seed: int | None = None) -> Generation:
        from vllm.inputs import TokensPrompt

        params = self.sampling_params(req.max_tokens, temperature, seed)
        final = None
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=list(req.prompt_ids)), params,
                                           request_id=req.request_id):
            final = out
        if final is None:
            raise RuntimeError(f"vLLM returned nothing for request {req.request_id}")
        c = final.outputs[0]
        ids = list(c.token_ids)
        logprobs = [float(d[t].logprob) for t, d in zip(ids, c.logprobs or [])]
        if len(logprobs) != len(ids):
            raise RuntimeError(f"vLLM gave {len(logprobs)} log-probs for {len(ids)} tokens")
        text, last = decode_pair(self.tokenizer, ids)
        return Generation(ids, logprobs, self._versions(c, len(ids)), c.finish_reason or "abort", text, last)

    def _versions(self, completion: Any, n: int) -> list[int]:
        spans = completion.weight_versions
        if not spans:
            return [self._version] * n
        out = [self._version] * n
        for span in spans:
            try:
                v = int(span.version)
            except (TypeError, ValueError):
                v = -1
            out[span.start:span.end] = [v] * (span.end - span.start)
        return out

    async def swap_weights(self, weights_dir: str, version: int) -> float:
        """Pause keeping in-flight requests, reload from a folder, reset the prefix cache, resume. Returns ms."""
        return await self._swap("krl_reload", {"weights_path": str(weights_dir)}, version, str(weights_dir))

    async def stage_bucket(self, key: str, index: int, data: bytes) -> None:
        """Hand one verified bucket of an in-memory version to the engine; generation goes on meanwhile."""
        await self.llm.collective_rpc("krl_stage", args=(key, index, data))

    async def drop_staged(self, key: str = "") -> None:
        await self.llm.collective_rpc("krl_drop", args=(key,))

    async def swap_staged(self, key: str, count: int, version: int) -> float:
        """Like ``swap_weights``, loading the ``count`` buckets staged under ``key`` (no file read). Returns ms."""
        return await self._swap("krl_apply", {"key": key, "count": int(count)}, version, f"memory ({key})")

    async def _swap(self, method: str, kwargs: dict, version: int, source: str) -> float:
        async with self._swap_lock:
            t0 = time.perf_counter()
            await self.llm.pause_generation(mode="keep", clear_cache=False)
            try:
                await self.llm.collective_rpc(method, kwargs=kwargs)
                await self.llm.update_weight_version(str(version))
                # Kept requests hold KV blocks from the old weights: preempt them so their
                # KV is recomputed, and drop every cached prefix (stale otherwise).
                ok = await self.llm.reset_prefix_cache(reset_running_requests=True)
                if not ok:
                    raise RuntimeError("vLLM refused to reset its prefix cache after a weight swap")
                self._version = version
            finally:
                await self.llm.resume_generation()
            ms = (time.perf_counter() - t0) * 1000
            self.swaps.append({"version": version, "ms": ms, "dir": source})
            log.info("weights v%d loaded from %s in %.1f ms", version, source, ms)
            return ms

    async def close(self) -> None:
        import gc

        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()
            llm.shutdown = lambda *a, **k: None  # AsyncLLM.__del__ would shut down again at teardown
            del llm
            gc.collect()  # run AsyncLLM.__del__ now, not at interpreter teardown
