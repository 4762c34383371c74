"""Is a decoded Task something an episode can run? One reason string per refusal, or ''.

The codec checks a record's shape (kind, schema version, field types); this checks meaning. A task the
actor cannot even start (an unknown backend, no reference source, a script that is not a list of turns)
is dead-lettered with this reason instead of crashing its episode, which would leave the task neither
trained, dead-lettered nor answered and hold back every later commit of its partition.
"""
from __future__ import annotations

from typing import Any

BACKENDS = ("cpu", "cuda")
MAX_SCRIPTED_TURNS = 1000


def task_problem(task: Any) -> str:
    """Why ``task`` cannot be rolled out, or '' when it can."""
    if not task.task_id.strip():
        return "task_id is empty"
    if task.backend not in BACKENDS:
        return f"backend {task.backend!r} is not one of {list(BACKENDS)}"
    if "class Model" not in task.model_py:
        return "model_py defines no `class Model` (the reference the oracle times against)"
    script = task.metadata.get("scripted_turns")
    if script is not None and not _valid_script(script):
        return "metadata.scripted_turns must be a list of at most %d strings" % MAX_SCRIPTED_TURNS
    return ""


def _valid_script(script: Any) -> bool:
    return isinstance(script, list) and len(script) <= MAX_SCRIPTED_TURNS and all(isinstance(t, str) for t in script)
