"""Parse the agent's tool calls out of generated text, robustly.

Format (documented in the system prompt):
    <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>
A response may hold several calls; each is parsed on its own, so one malformed
call becomes an error observation while the others still run. Nothing here
raises on bad model output.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS_PER_TURN = 8
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def key(self) -> str:
        """Canonical form, used to detect repeated identical actions."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, sort_keys=True, default=str)


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed call

    @property
    def malformed(self) -> bool:
        return bool(self.errors)


def _strip_fences(body: str) -> str:
    body = body.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    return body.strip()


def _parse_one(body: str) -> tuple[ToolCall | None, str]:
    text = _strip_fences(body)
    if not text:
        return None, "empty <tool_call> block"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"tool call is not valid JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(obj, dict):
        return None, f"tool call must be a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, 'tool call needs a string "name"'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return None, f'"arguments" of {name!r} is a string that is not JSON ({exc.msg})'
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f'"arguments" of {name!r} must be an object, got {type(args).__name__}'
    return ToolCall(name=name.strip(), arguments=args), ""


def parse(text: str, known_tools: set[str] | frozenset[str] | None = None) -> ParsedTurn:
    """All tool calls in ``text``; malformed ones become errors, never exceptions."""
    out = ParsedTurn()
    end_of_blocks = 0
    for m in _BLOCK.finditer(text):
        end_of_blocks = m.end()
        if len(out.calls) + len(out.errors) >= MAX_CALLS_PER_TURN:
            out.errors.append(f"more than {MAX_CALLS_PER_TURN} tool calls in one turn; the rest were ignored")
            break
        call, err = _parse_one(m.group(1))
        if call is None:
            out.errors.append(err)
        elif known_tools is not None and call.name not in known_tools:
            out.errors.append(f"unknown tool {call.name!r}; available: {', '.join(sorted(known_tools))}")
        else:
            out.calls.append(call)
    tail = text[end_of_blocks:]
    if OPEN in tail:
        out.errors.append(f"unterminated {OPEN} (missing {CLOSE})")
    elif CLOSE in tail:
        out.errors.append(f"{CLOSE} without a matching {OPEN}")
    return out


def format_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of one call (scripted policies and docs use it)."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments})}{CLOSE}"
