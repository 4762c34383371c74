"""What every policy backend shares: the request and generation types, the Policy protocol, tokenizer helpers.

policy.py (the factory and the scripted backend), policy_vllm.py and policy_openai.py all
import it; none of them imports another, so the backends and the factory form no cycle.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


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


def load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)
