"""The OpenAI-compatible policy backend: evaluate an external model through the same tools.

Sends the episode's chat messages to ``<base_url>/chat/completions`` and returns
the reply. The endpoint's own tokens are unknown here, so the reply is tokenized
with the local tokenizer only to keep the trajectory's bookkeeping (turns,
context cap); such trajectories are marked not trainable and carry no log-probs.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import urllib.error
import urllib.request
from typing import Any

from actors.policy_api import GenRequest, Generation, decode_pair
from cluster.errors import KernelRLError, RetriableError

log = logging.getLogger(__name__)


class EndpointError(RetriableError):
    """The endpoint failed or answered something that is not a chat completion."""


class OpenAIPolicy:
    name = "openai"
    has_logprobs = False
    trainable = False

    def __init__(self, tokenizer: Any, acfg: Any, *, timeout_s: float = 600.0):
        if not acfg.openai_base_url:
            raise KernelRLError("actor.openai_base_url is empty: set it to the endpoint, e.g. http://host:8000/v1")
        self.tokenizer = tokenizer
        self.url = acfg.openai_base_url.rstrip("/") + "/chat/completions"
        self.model = acfg.openai_model
        self.temperature = acfg.temperature
        self.api_key = os.environ.get(acfg.openai_api_key_env, "")
        self.timeout_s = timeout_s
        eos = getattr(tokenizer, "eos_token_id", None)
        self._eos = [eos] if isinstance(eos, int) else []

    @property
    def version(self) -> int:
        return -1

    def _post(self, body: dict) -> dict:
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise EndpointError(f"{self.url}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ValueError) as exc:
            raise EndpointError(f"{self.url}: {exc}") from None

    async def generate(self, req: GenRequest) -> Generation:
        body = {"model": self.model, "messages": req.messages, "max_tokens": req.max_tokens,
                "temperature": self.temperature}
        reply = await asyncio.to_thread(self._post, body)
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
            reason = choice.get("finish_reason") or "stop"
        except (KeyError, IndexError, TypeError):
            raise EndpointError(f"{self.url}: not a chat completion: {str(reply)[:300]}") from None
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))[:req.max_tokens]
        if reason != "length":
            ids += self._eos
        out_text, last = decode_pair(self.tokenizer, ids)
        return Generation(ids, [0.0] * len(ids), [-1] * len(ids), "length" if reason == "length" else "stop",
                          text, last)

    async def close(self) -> None:
        return None
