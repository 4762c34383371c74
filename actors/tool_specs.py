"""JSON schemas of the agent's tools (OpenAI function format), shown in the system prompt."""
from __future__ import annotations


def _fn(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


_S = {"type": "string"}
_I = {"type": "integer"}

LOCAL = [
    _fn("bash", "Run a shell command in the workspace (no network, time-limited, output truncated).",
        {"command": _S, "timeout_s": {"type": "number"}}, ["command"]),
    _fn("read", "Read a text file of the workspace with line numbers.",
        {"path": _S, "offset": _I, "limit": _I}, ["path"]),
    _fn("write", "Create or overwrite a file of the workspace.", {"path": _S, "content": _S}, ["path", "content"]),
    _fn("edit", "Replace one exact occurrence of old_string by new_string in a file (or all with replace_all).",
        {"path": _S, "old_string": _S, "new_string": _S, "replace_all": {"type": "boolean"}},
        ["path", "old_string", "new_string"]),
    _fn("multi_edit", "Apply several edits to one file, all or nothing.",
        {"path": _S, "edits": {"type": "array", "items": {"type": "object", "properties": {
            "old_string": _S, "new_string": _S, "replace_all": {"type": "boolean"}}}}}, ["path", "edits"]),
    _fn("glob", "List workspace files matching a glob pattern such as kernels/*.cpp.",
        {"pattern": _S, "path": _S}, ["pattern"]),
    _fn("grep", "Search workspace files for a regular expression.", {"pattern": _S, "path": _S, "glob": _S},
        ["pattern"]),
    _fn("todo_write", "Replace your todo list.", {"todos": {"type": "array", "items": {
        "type": "object", "properties": {"content": _S, "status": _S}}}}, ["todos"]),
]
REMOTE = [
    _fn("compile", "Build model_new.py and kernels/ into an extension; returns the compiler log.", {}, []),
    _fn("verify", "Compile if needed, then check ModelNew against Model on several random inputs.", {}, []),
    _fn("profile", "Compile if needed, verify, then time ModelNew against eager and torch.compile.", {}, []),
]
FINISH = [_fn("finish", "End the episode; your current workspace is evaluated for the reward.",
              {"summary": _S}, [])]

ALL = LOCAL + REMOTE + FINISH
NAMES = frozenset(t["function"]["name"] for t in ALL)
REMOTE_NAMES = frozenset(t["function"]["name"] for t in REMOTE)
