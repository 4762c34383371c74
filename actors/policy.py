"""The policy factory (a backend by name) and the scripted backend; re-exports the interface of policy_api.py.

A policy turns the episode's token stream (and, for chat endpoints, its
messages) into one assistant turn: the token ids it produced, the behaviour
log-prob and the policy version of each token. Backends: ``vllm`` (in-process
AsyncLLM, see policy_vllm.py), ``scripted`` (replays given turns; no log-probs
of its own) and ``openai`` (an OpenAI-compatible endpoint; evaluation only).
"""
from __future__ import annotations

import logging
from typing import Any

from actors.policy_api import GenRequest, Generation, Policy, decode_pair, load_tokenizer

__all__ = ["GenRequest", "Generation", "Policy", "ScriptedPolicy", "decode_pair", "load_tokenizer", "make_policy"]

log = logging.getLogger(__name__)


class ScriptedPolicy:
    """Replays a fixed list of assistant turns (tests, demos); honest about having no log-probs."""

    name = "scripted"
    has_logprobs = False
    trainable = False

    def __init__(self, tokenizer: Any, turns: list[str], *, version: int = 0, delay_s: float = 0.0):
        self.tokenizer = tokenizer
        self.turns = list(turns)
        self._version = version
        self.delay_s = delay_s
        self.calls = 0
        eos = getattr(tokenizer, "eos_token_id", None)
        self._eos = [eos] if isinstance(eos, int) else []

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, req: GenRequest) -> Generation:
        import asyncio

        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        turns = req.script if req.script is not None else self.turns
        text = turns[req.turn] if req.turn < len(turns) else \
            '<tool_call>{"name": "finish", "arguments": {}}</tool_call>'
        self.calls += 1
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + self._eos
        finish = "stop"
        if len(ids) > req.max_tokens:
            ids, finish = ids[:req.max_tokens], "length"
        out_text, last = decode_pair(self.tokenizer, ids)
        return Generation(ids, [0.0] * len(ids), [self._version] * len(ids), finish, out_text, last)

    async def close(self) -> None:
        return None


async def make_policy(cfg: Any, model_path: str, *, scripted_turns: list[str] | None = None) -> Policy:
    """Build the backend named by ``cfg.actor.policy``."""
    kind = cfg.actor.policy
    if kind == "vllm":
        from actors.policy_vllm import VLLMPolicy

        return await VLLMPolicy.start(model_path, cfg.actor)
    if kind == "openai":
        from actors.policy_openai import OpenAIPolicy

        return OpenAIPolicy(load_tokenizer(model_path), cfg.actor)
    if kind == "scripted":
        return ScriptedPolicy(load_tokenizer(model_path), scripted_turns or [])
    raise ValueError(f"actor.policy: unknown backend {kind!r}")
