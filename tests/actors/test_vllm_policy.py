"""Real vLLM (CPU, float32, tiny model): token-exact log-probs, per-token versions, hot-swap."""
from __future__ import annotations

import asyncio

from actors.policy import GenRequest

from .conftest import perturbed_copy

PROMPT = [11, 42, 97, 230, 512, 7, 1000, 64]


def _greedy(aloop, engine, rid, n=24):
    return aloop.run(engine.generate(GenRequest(PROMPT, n, rid), temperature=0.0)).token_ids


def _max_logprob_diff(gen, model_dir):
    """Largest |vLLM log-prob - transformers log-prob| over the generated tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([PROMPT + gen.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    n = len(PROMPT)
    ref = logp[n - 1:n - 1 + len(gen.token_ids)].gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0]
    return (ref - torch.tensor(gen.logprobs)).abs().max().item()


def test_logprobs_match_transformers_recomputation(aloop, engine, tiny_model):
    gen = aloop.run(engine.generate(GenRequest(PROMPT, 48, "lp-1"), temperature=1.0, seed=7))
    assert len(gen.token_ids) == len(gen.logprobs) == len(gen.versions) > 0
    assert set(gen.versions) == {engine.version}
    diff = _max_logprob_diff(gen, tiny_model)
    assert diff < 1e-4, f"vLLM vs transformers log-prob max diff {diff}"


def test_hot_swap_changes_output_and_swapping_back_restores_it(aloop, engine, tiny_model, tmp_path):
    base = _greedy(aloop, engine, "hs-0")
    v0 = engine.version
    other = perturbed_copy(tiny_model, tmp_path / "v1")

    async def swap_with_inflight(folder, version):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=300, temperature=0.0, ignore_eos=True, logprobs=0,
                                output_kind=RequestOutputKind.DELTA, detokenize=False)
        started = asyncio.Event()

        async def long_request():
            ids, final = [], None
            async for out in engine.llm.generate(TokensPrompt(prompt_token_ids=PROMPT), params,
                                                 request_id=f"inflight-{version}"):
                ids += out.outputs[0].token_ids
                started.set()
                final = out.outputs[0]
            return ids, final

        task = asyncio.create_task(long_request())
        await started.wait()  # tokens are being generated with the old weights
        ms = await engine.swap_weights(folder, version)
        return await task, ms

    try:
        _swap_and_back(aloop, engine, tiny_model, other, base, v0, swap_with_inflight)
    finally:
        if engine.version != v0 + 2:  # leave the shared engine on the original weights
            aloop.run(engine.swap_weights(tiny_model, engine.version + 1))


def _swap_and_back(aloop, engine, tiny_model, other, base, v0, swap_with_inflight):
    (ids, final), ms = aloop.run(swap_with_inflight(other, v0 + 1))
    assert engine.version == v0 + 1 and ms > 0
    assert len(ids) == 300 and final.finish_reason == "length"  # the in-flight request completed
    spans = [(s.version, s.start, s.end) for s in final.weight_versions]
    assert [s[0] for s in spans] == [str(v0), str(v0 + 1)], spans  # the request spans the swap
    assert spans[0][1] == 0 and spans[-1][2] == 300
    versions = engine._versions(final, len(ids))
    assert versions[0] == v0 and versions[-1] == v0 + 1

    swapped = _greedy(aloop, engine, "hs-1")
    assert swapped != base, "new weights must change the greedy output"
    gen = aloop.run(engine.generate(GenRequest(PROMPT, 32, "hs-1v"), temperature=1.0, seed=3))
    assert set(gen.versions) == {v0 + 1}
    diff = _max_logprob_diff(gen, other)  # every weight (tied head included) really is the new one
    assert diff < 1e-4, f"after the swap, vLLM vs transformers(new weights) max diff {diff}"

    aloop.run(engine.swap_weights(tiny_model, v0 + 2))  # the original weights, as a newer version
    assert _greedy(aloop, engine, "hs-2") == base
    assert engine.version == v0 + 2
    gen = aloop.run(engine.generate(GenRequest(PROMPT, 32, "hs-2v"), temperature=1.0, seed=4))
    diff = _max_logprob_diff(gen, tiny_model)
    assert diff < 1e-4, f"after swapping back, vLLM vs transformers(original) max diff {diff}"
