"""`kernelrl bench actor`: agent-loop tokens/s against bare vLLM generation, and hot-swap latency.

In one run, with the tiny local model on CPU (or ``--model``):
  1. loop: E episodes (C at a time) of the real agent loop with the vLLM policy: prompt
     rendering, generation, tool-call parsing, local tools, observation tokens, trajectory;
  2. raw: the very same requests (each turn's exact prompt ids and generated length) replayed
     straight into the engine, C streams at a time, with no agent logic;
  3. swap: pause/reload/reset/resume of the weights, idle and with requests in flight.
Both throughputs count generated tokens over wall time; ``loop_overhead`` = 1 - loop/raw.
"""
from __future__ import annotations

import asyncio
import logging
import statistics
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)


def _options(rest: list[str]):
    import argparse

    p = argparse.ArgumentParser(prog="kernelrl bench actor", add_help=False)
    p.add_argument("--model", default="")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64, help="max new tokens per turn")
    p.add_argument("--swaps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3, help="loop/raw pairs; the best of each is reported")
    return p.parse_args(rest)


class _NoBus:
    async def request(self, *a, **kw):
        raise RuntimeError("no tool workers in the actor benchmark")


async def _loop_round(cfg, policy, opts, ws_root: Path):
    from actors import tool_specs
    from actors.actor import run_episode
    from actors.agent import EpisodeLimits
    from actors.chat import ChatRenderer
    from schemas.messages import Task

    from actors.workspace import SKILLS_DIR

    model_py = (SKILLS_DIR / "examples" / "cpu_19_relu" / "model.py").read_text()
    limits = EpisodeLimits(max_turns=opts.turns, max_context_tokens=cfg.actor.max_context_tokens,
                           max_new_tokens=opts.tokens)
    renderer = ChatRenderer(policy.tokenizer, tool_specs.ALL)
    sem = asyncio.Semaphore(opts.concurrency)

    async def one(i):
        async with sem:
            task = Task(task_id=f"bench-{i}", model_py=model_py, backend="cpu", name="19_ReLU")
            traj, _ = await run_episode(cfg, policy, renderer, task, _NoBus(), ws_root, "bench", limits)
            return traj

    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(one(i) for i in range(opts.episodes)))
    wall = time.perf_counter() - t0
    return trajs, wall


async def _raw_round(policy, trajs, concurrency: int) -> float:
    """Replay every turn of ``trajs`` (same prompt ids, same generated length) with no agent logic."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sem = asyncio.Semaphore(concurrency)

    async def replay(k, traj):
        async with sem:
            for j, turn in enumerate(traj.turns):
                n = turn.gen_end - turn.gen_start
                params = SamplingParams(max_tokens=n, ignore_eos=True, temperature=1.0, logprobs=0,
                                        detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY)
                prompt = TokensPrompt(prompt_token_ids=traj.token_ids[:turn.gen_start].tolist())
                async for _ in policy.llm.generate(prompt, params, request_id=f"raw-{k}-{j}-{time.time_ns()}"):
                    pass

    t0 = time.perf_counter()
    await asyncio.gather(*(replay(k, t) for k, t in enumerate(trajs)))
    return time.perf_counter() - t0


async def _prime(policy, prompt: list[int]) -> None:
    """Same start for both sides: an empty prefix cache, then the shared system prompt cached."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    await policy.llm.reset_prefix_cache()
    async for _ in policy.llm.generate(TokensPrompt(prompt_token_ids=prompt), SamplingParams(max_tokens=1),
                                       request_id=f"prime-{time.time_ns()}"):
        pass


async def _swaps(policy, model: str, n: int) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    idle = [await policy.swap_weights(model, policy.version + 1) for _ in range(n)]
    busy = []
    params = SamplingParams(max_tokens=256, ignore_eos=True, detokenize=False)
    for i in range(n):
        async def inflight(i=i):
            async for _ in policy.llm.generate(TokensPrompt(prompt_token_ids=list(range(10, 60))), params,
                                               request_id=f"swap-{i}-{time.time_ns()}"):
                pass

        t = asyncio.create_task(inflight())
        await asyncio.sleep(0.05)
        busy.append(await policy.swap_weights(model, policy.version + 1))
        await t
    return {"swap_ms": round(statistics.median(idle), 2), "swap_ms_inflight": round(statistics.median(busy), 2),
            "swap_ms_all": [round(x, 2) for x in idle + busy]}


async def _bench(cfg, opts) -> dict:
    from actors.cmd import resolve_model
    from actors.policy_vllm import VLLMPolicy

    model = resolve_model(cfg, opts.model)
    cfg.actor.max_context_tokens = min(cfg.actor.max_context_tokens, 16384)
    t0 = time.perf_counter()
    policy = await VLLMPolicy.start(model, cfg.actor)
    start_s = time.perf_counter() - t0
    try:
        with tempfile.TemporaryDirectory(prefix="krl-bench-") as tmp:
            warm, _ = await _loop_round(cfg, policy, _Small(opts), Path(tmp))  # warm-up
            prompt = warm[0].token_ids[:warm[0].prompt_len].tolist()
            loops, raws, gen_tokens, turns = [], [], 0, 0
            for _ in range(opts.rounds):
                await _prime(policy, prompt)
                trajs, wall = await _loop_round(cfg, policy, opts, Path(tmp))
                gen_tokens = sum(int(t.loss_mask.sum()) for t in trajs)
                turns = sum(len(t.turns) for t in trajs)
                loops.append(gen_tokens / wall)
                await _prime(policy, prompt)
                raws.append(gen_tokens / await _raw_round(policy, trajs, opts.concurrency))
        swaps = await _swaps(policy, model, opts.swaps)
    finally:
        await policy.close()
    loop_tok_s, raw_tok_s = max(loops), max(raws)
    return {"bench": "actor", "model": model, "engine_start_s": round(start_s, 2), "episodes": opts.episodes,
            "concurrency": opts.concurrency, "turns": turns, "generated_tokens": gen_tokens,
            "loop_tok_s": round(loop_tok_s, 1), "raw_tok_s": round(raw_tok_s, 1),
            "loop_vs_raw": round(loop_tok_s / raw_tok_s, 4), "loop_overhead": round(1 - loop_tok_s / raw_tok_s, 4),
            "loop_vs_raw_median_pair": round(statistics.median(a / b for a, b in zip(loops, raws)), 4),
            "loop_tok_s_rounds": [round(x, 1) for x in loops], "raw_tok_s_rounds": [round(x, 1) for x in raws],
            **swaps}


class _Small:
    """Warm-up options: a short round."""

    def __init__(self, opts):
        self.__dict__.update(vars(opts))
        self.episodes, self.turns = min(opts.episodes, opts.concurrency), 1


def run_bench(args, cfg) -> dict:
    import uvloop

    opts = _options(getattr(args, "rest", []) or [])
    return uvloop.run(_bench(cfg, opts))
