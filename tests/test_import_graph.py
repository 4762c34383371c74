"""The project's import graph has no cycles, and schemas/ pulls in no torch, vLLM or DeepSpeed.

The graph is read statically with ``ast``: module-level imports and the imports inside
functions (which hide a cycle from Python, not from this test), intra-project only;
imports under ``if TYPE_CHECKING:`` never run and are left out. Parsing needs no GPU,
so every module is read; only ``__main__`` scripts are skipped.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "cluster", "learner", "sandbox_workers", "schemas")
HEAVY = {"torch", "vllm", "deepspeed"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if path.name == "__main__.py":
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom that can run: at module level or in a function, not under TYPE_CHECKING."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            children = node.orelse
        todo.extend(children)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported_names(node, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement loads (a ``from x import y`` may name a submodule x.y)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    source = _absolute(node, module, is_package)
    return [source] + [f"{source}.{a.name}" for a in node.names if a.name != "*"]


def _graph(mods: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> project modules it imports, module -> top-level third-party names it imports)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    external: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _import_nodes(tree):
            for name in _imported_names(node, mod, path.name == "__init__.py"):
                if name.split(".")[0] not in PACKAGES:
                    external[mod].add(name.split(".")[0])
                    continue
                while name and name not in mods:  # `import a.b.c` of a name inside a module: that module
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    edges[mod].add(name)
    return edges, external


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(_one_cycle(sorted(comp), edges))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps


def _one_cycle(comp: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start, inside = comp[0], set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, v, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def test_the_graph_reader_finds_a_hidden_cycle(tmp_path):
    """A cycle closed only by an import inside a function is found (so the real check can fail)."""
    pkg = tmp_path / "actors"
    pkg.mkdir()
    (pkg / "a.py").write_text("from actors.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from actors import a\n    return a\nx = 1\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from actors import a\n")
    mods = {f"actors.{p.stem}": p for p in sorted(pkg.glob("*.py"))}
    edges, _ = _graph(mods)
    assert edges["actors.c"] == set()
    assert _cycles(edges) == [["actors.a", "actors.b", "actors.a"]]


def test_no_import_cycles():
    edges, _ = _graph(_modules())
    cycles = _cycles(edges)
    for c in cycles:
        print("import cycle: " + " -> ".join(c))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_schemas_imports_no_torch_vllm_or_deepspeed():
    """Neither schemas/ nor any project module it reaches imports the heavy libraries."""
    mods = _modules()
    edges, external = _graph(mods)
    reached, todo = set(), [m for m in mods if m.split(".")[0] == "schemas"]
    assert todo
    while todo:
        m = todo.pop()
        if m not in reached:
            reached.add(m)
            todo.extend(edges[m])
    heavy = {m: sorted(external[m] & HEAVY) for m in sorted(reached) if external[m] & HEAVY}
    assert not heavy, f"schemas/ reaches modules that import torch/vllm/deepspeed: {heavy}"
