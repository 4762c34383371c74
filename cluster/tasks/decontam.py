"""Decontamination: drop tasks whose AST is too similar to a task of the evaluation set.

A task is reduced to a token sequence of its syntax tree: node types in pre-order, with
library API names kept (``torch.matmul``, ``nn.Conv2d``, ``F.gelu``) and everything a
copier could rename abstracted away (local names, attribute names of ``self``,
constants, docstrings, comments). Similarity is difflib's ratio of the two sequences
(2 * matches / total length); a task whose best match exceeds the threshold (0.9 by
default, as CUDA Agent) is dropped.
"""
from __future__ import annotations

import ast
import difflib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
_API_ROOTS = {"torch", "nn", "F", "math", "functional"}
# Library calls decide what a task computes, so they weigh more than the plumbing around them.
API_WEIGHT = 4
_KEEP_FUNCS = {"__init__", "forward", "get_inputs", "get_init_inputs"}


def _api_name(node: ast.AST, roots: set[str]) -> str | None:
    """'torch.nn.functional.gelu' for an attribute chain rooted at a library name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in roots:
        return ".".join([node.id, *reversed(parts)])
    return None


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]


def _is_super_init(node: ast.AST) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "__init__")


def ast_tokens(source: str) -> list[str]:
    """The normalised token sequence of a Python source (raises SyntaxError on bad code)."""
    tree = ast.parse(source)
    _strip_docstrings(tree)
    roots = set(_API_ROOTS)
    for node in tree.body:  # names imported from libraries are API names too (from transformers import X)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            roots.update((a.asname or a.name).split(".")[0] for a in node.names)
    # The computation lives in the classes (and helper functions); input/init-argument
    # builders and shape constants are shared boilerplate that would mask differences.
    tree.body = [n for n in tree.body if isinstance(n, ast.ClassDef)
                 or (isinstance(n, ast.FunctionDef) and n.name not in ("get_inputs", "get_init_inputs"))]
    tokens: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_super_init(node):
            return  # imports and super().__init__() say nothing about the computation
        api = _api_name(node, roots) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if api:
            tokens.extend([api] * API_WEIGHT)
            return
        tokens.append(type(node).__name__)
        if isinstance(node, ast.FunctionDef) and node.name in _KEEP_FUNCS:
            tokens.append(node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            tokens.append(f"kw:{node.arg}")
        elif isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.AugAssign)):
            op = getattr(node, "op", None) or (node.ops[0] if isinstance(node, ast.Compare) else None)
            tokens.append(type(op).__name__)
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.expr_context, ast.operator, ast.cmpop, ast.boolop, ast.unaryop)):
                visit(child)

    visit(tree)
    return tokens


def similarity(a: list[str], b: list[str]) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


@dataclass
class Match:
    score: float
    name: str


class Decontaminator:
    """Holds the evaluation set's token sequences; `best(source)` finds the closest one."""

    def __init__(self, eval_sources: dict[str, str], threshold: float = 0.9):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"decontamination threshold must be in (0, 1], got {threshold!r}")
        self.threshold = threshold
        self.refs: list[tuple[str, list[str]]] = []
        for name, src in sorted(eval_sources.items()):
            try:
                self.refs.append((name, ast_tokens(src)))
            except SyntaxError:
                log.warning("evaluation task %s does not parse; skipped", name)

    @classmethod
    def from_dir(cls, folder: str | os.PathLike, threshold: float = 0.9) -> "Decontaminator":
        folder = Path(folder)
        if not folder.is_dir():
            raise FileNotFoundError(f"evaluation set {str(folder)!r} does not exist")
        sources = {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.py"))}
        return cls(sources, threshold)

    def best(self, source: str) -> Match:
        tokens = ast_tokens(source)
        best = Match(0.0, "")
        for name, ref in self.refs:
            sm = difflib.SequenceMatcher(None, tokens, ref, autojunk=False)
            if sm.real_quick_ratio() <= best.score or sm.quick_ratio() <= best.score:
                continue
            score = sm.ratio()
            if score > best.score:
                best = Match(score, name)
        return best

    def is_contaminated(self, source: str) -> tuple[bool, Match]:
        match = self.best(source)
        return match.score > self.threshold, match


def default_eval_dir() -> Path:
    """KERNELRL_KERNELBENCH, or ../shared/kernelbench relative to the repository root."""
    env = os.environ.get("KERNELRL_KERNELBENCH")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "kernelbench"
