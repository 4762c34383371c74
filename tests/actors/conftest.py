"""Fixtures of the actor tests: the tiny model, a background event loop, one shared vLLM engine."""
from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")


class LoopThread:
    """A uvloop event loop on its own thread; ``run(coro)`` waits for the result."""

    def __init__(self) -> None:
        import uvloop

        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 180.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    from actors.policy import load_tokenizer

    return load_tokenizer(tiny_model)


@pytest.fixture(scope="session")
def aloop():
    lt = LoopThread()
    yield lt
    lt.close()


def actor_cfg(**overrides):
    from cluster.config import Config

    cfg = Config()
    a = cfg.actor
    a.max_context_tokens, a.kv_cache_mb, a.max_new_tokens, a.temperature = 16384, 64, 64, 1.0
    for k, v in overrides.items():
        setattr(a, k, v)
    return cfg


@pytest.fixture(scope="session")
def engine(aloop, tiny_model):
    """One real vLLM engine (CPU, float32) for the whole session: it takes ~20 s to start."""
    from actors.policy_vllm import VLLMPolicy

    policy = aloop.run(VLLMPolicy.start(tiny_model, actor_cfg().actor), timeout=300)
    yield policy
    aloop.run(policy.close())


def perturbed_copy(src: str, dest: Path, scale: float = 0.5, seed: int = 1) -> str:
    """A copy of the model folder with noise added to every weight (a different policy)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    for p in Path(src).iterdir():
        if p.is_file() and p.suffix != ".safetensors":
            shutil.copy2(p, dest / p.name)
    g = torch.Generator().manual_seed(seed)
    tensors = load_file(str(Path(src) / "model.safetensors"))
    noisy = {k: (v + scale * v.std().nan_to_num(0.02) * torch.randn(v.shape, generator=g)).contiguous()
             for k, v in tensors.items()}
    save_file(noisy, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return str(dest)
