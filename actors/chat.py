"""Turn conversation pieces into token ids with the model's own chat template.

The prompt is rendered once. After each assistant turn only the *delta* is
rendered and tokenized: the template's end-of-turn glue, the tool observation
and the next assistant header. The delta is found by rendering a short
conversation with a sentinel as the assistant's content and keeping what the
template puts after it, so any chat template works (Qwen's, a local one) and the
generated tokens are never re-tokenized.
"""
from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)

SENTINEL = "KRLSENTINEL7f3a9c"
TOOL_FORMAT_HELP = (
    "To call a tool, write exactly one JSON object per call inside tags:\n"
    '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>\n'
    "You may make several calls in one reply. Results come back inside <tool_response> tags. "
    "Call the `finish` tool when you are done."
)


def tool_schema_text(tools: list[dict]) -> str:
    """Plain-text rendering of the tool schemas, for templates that ignore `tools=`."""
    lines = ["# Tools", "", "You may call one or more functions. Their signatures:", "<tools>"]
    lines += [json.dumps(t, sort_keys=True) for t in tools]
    lines += ["</tools>", "", TOOL_FORMAT_HELP]
    return "\n".join(lines)


class ChatRenderer:
    """Prompt and observation token ids for one tokenizer and one tool set."""

    def __init__(self, tokenizer: Any, tools: list[dict] | None = None):
        self.tok = tokenizer
        self.tools = list(tools or [])
        self._glue_cache: tuple[str, str] | None = None
        self._template_renders_tools = self._probe_tools()
        self._tool_role = self._probe_tool_role()

    # -- rendering helpers --------------------------------------------------
    def _render(self, messages: list[dict], gen_prompt: bool, tools: list[dict] | None = None) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": gen_prompt}
        if tools:
            kwargs["tools"] = tools
        return self.tok.apply_chat_template(messages, **kwargs)

    def _probe_tools(self) -> bool:
        if not self.tools:
            return False
        name = self.tools[0]["function"]["name"]
        try:
            text = self._render([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                True, self.tools)
        except Exception as exc:  # noqa: BLE001 - any template error means "does not render tools"
            log.debug("chat template rejects tools=: %s", exc)
            return False
        return f'"{name}"' in text and "<tool_call>" in text

    def _probe_tool_role(self) -> str:
        try:
            text = self._render(self._probe_messages("tool", "OBSPROBE"), True)
        except Exception:  # noqa: BLE001 - template without a tool role
            return "user"
        return "tool" if "OBSPROBE" in text else "user"

    @staticmethod
    def _probe_messages(role: str, content: str) -> list[dict]:
        return [{"role": "user", "content": "u"}, {"role": "assistant", "content": SENTINEL},
                {"role": role, "content": content}]

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    # -- public API ---------------------------------------------------------
    def system_text(self, skill_md: str) -> str:
        if self.tools and not self._template_renders_tools:
            return f"{skill_md.rstrip()}\n\n{tool_schema_text(self.tools)}"
        if self.tools:
            return f"{skill_md.rstrip()}\n\n{TOOL_FORMAT_HELP}"
        return skill_md

    def prompt_ids(self, system: str, user: str) -> list[int]:
        """The episode's first tokens: system (+ tool schema) and the task, then the assistant header."""
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        tools = self.tools if self._template_renders_tools else None
        return self.encode(self._render(msgs, True, tools))

    def _glue(self) -> tuple[str, str]:
        """(text before, text after) the observation in the template's delta; rendered once."""
        if self._glue_cache is None:
            marker = "KRLOBSMARKER5d1e"
            content = marker if self._tool_role == "tool" else f"<tool_response>\n{marker}\n</tool_response>"
            full = self._render(self._probe_messages(self._tool_role, content), True)
            suffix = full[full.rindex(SENTINEL) + len(SENTINEL):]
            if suffix.count(marker) != 1:
                raise ValueError("chat template renders the tool observation more than once")
            self._glue_cache = tuple(suffix.split(marker))
        return self._glue_cache

    def observation_text(self, observation: str, last_token_text: str) -> str:
        """Template text between the generated turn and the next assistant turn."""
        before, after = self._glue()
        suffix = before + observation + after
        # The engine already produced the end-of-turn token (e.g. <|im_end|>): do not repeat it.
        if last_token_text and suffix.startswith(last_token_text):
            suffix = suffix[len(last_token_text):]
        return suffix

    def observation_ids(self, observation: str, last_token_text: str) -> list[int]:
        return self.encode(self.observation_text(observation, last_token_text))

    def messages_for_openai(self, system: str, user: str) -> list[dict]:
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]
