"""Shrink a GPU-sized task's shape constants so it can be evaluated on a CPU (same computation, smaller sizes).

The module-level integer constants of a KernelBench file (``batch_size = 4096``,
``N = 2048 * 2``, ...) are halved, largest first, until the inputs of ``get_inputs()``
hold at most ``max_numel`` elements. Every step is checked on the meta device (the
model builds and its forward runs on the new shapes); a constant whose halving breaks
the task is left alone. The result is a different (smaller) task: reports say so.
"""
from __future__ import annotations

import ast
import logging

log = logging.getLogger(__name__)
_SAFE_NODES = (ast.Expression, ast.BinOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Pow,
               ast.UnaryOp, ast.USub)


def _constants(tree: ast.Module) -> dict[str, tuple[int, ast.Assign]]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            expr = ast.Expression(node.value)
            if all(isinstance(n, _SAFE_NODES) for n in ast.walk(expr)):
                value = eval(compile(expr, "<const>", "eval"), {"__builtins__": {}})  # noqa: S307 - literals only
                if isinstance(value, int) and not isinstance(value, bool):
                    out[node.targets[0].id] = (value, node)
    return out


def _with_values(source: str, values: dict[str, int]) -> str:
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in sorted((n for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
                        and isinstance(n.targets[0], ast.Name) and n.targets[0].id in values),
                       key=lambda n: n.lineno, reverse=True):
        name = node.targets[0].id
        start, end = node.lineno - 1, node.end_lineno
        lines[start:end] = [f"{name} = {values[name]}\n"]
    return "".join(lines)


def _probe(source: str) -> int | None:
    """Total input elements on the meta device, or None if the task no longer builds and runs."""
    import torch

    ns: dict = {}
    try:
        exec(compile(source, "<shrink>", "exec"), ns)  # noqa: S102 - a trusted task file (eval set)
        with torch.device("meta"):
            inputs = ns["get_inputs"]()
            model = ns["Model"](*ns["get_init_inputs"]())
            model(*inputs)
    except Exception:  # noqa: BLE001 - any failure means this size is not valid for the task
        return None
    return sum(t.numel() for t in inputs if isinstance(t, torch.Tensor))


def shrink_task(source: str, max_numel: int = 1 << 20, max_steps: int = 200) -> tuple[str, dict[str, tuple[int, int]]]:
    """(smaller source, {name: (old, new)}); the source unchanged when it is already small enough."""
    consts = {k: v for k, (v, _) in _constants(ast.parse(source)).items()}
    numel = _probe(source)
    if numel is None or numel <= max_numel:
        return source, {}
    values, frozen = dict(consts), set()
    for _ in range(max_steps):
        movable = [k for k, v in values.items() if v >= 4 and k not in frozen]
        if not movable or numel <= max_numel:
            break
        name = max(movable, key=lambda k: values[k])
        trial = dict(values, **{name: values[name] // 2})
        got = _probe(_with_values(source, trial))
        if got is None or got >= numel:
            frozen.add(name)
            continue
        values, numel = trial, got
    changed = {k: (consts[k], v) for k, v in values.items() if v != consts[k]}
    return _with_values(source, {k: v for k, (_, v) in changed.items()}), changed
