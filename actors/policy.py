"""The policy interface the agent loop talks to, the scripted backend, and the factory.

A policy turns the episode's token stream (and, for chat endpoints, its
messages) into one assistant turn: the token ids it produced, the behaviour
log-prob and the policy version of each token. Backends: ``vllm`` (in-process
AsyncLLM, see policy_vllm.py), ``scripted`` (replays given turns; no log-probs
of its own) and ``openai`` (an OpenAI-compatible endpoint; evaluation only).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    request_id: str
    messages: list[dict] = field(default_factory=list)  # same conversation, as chat messages
    turn: int = 0  # index of this assistant turn in the episode
    script: list[str] | None = None  # scripted backend: this episode's turns (from the task)


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # stop | length | abort
    text: str = ""  # decoded without special tokens, for tool-call parsing
    last_token_text: str = ""  # decoded last token with special tokens (the end-of-turn marker)


class Policy(Protocol):
    name: str
    has_logprobs: bool
    trainable: bool  # False for backends whose tokens are not the engine's own (openai)
    tokenizer: Any

    @property
    def version(self) -> int: ...

    async def generate(self, req: GenRequest) -> Generation: ...

    async def close(self) -> None: ...


def decode_pair(tokenizer: Any, ids: list[int]) -> tuple[str, str]:
    """(text without special tokens, text of the last token with specials)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    last = tokenizer.decode(ids[-1:], skip_special_tokens=False) if ids else ""
    return text, last


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


def load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


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
