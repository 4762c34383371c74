"""The project's import graph has no cycles, every module imports alone, and schemas/ pulls in
no torch, vLLM or DeepSpeed.

The graph is read statically with ``ast``: module-level imports and the imports inside
functions (which hide a cycle from Python, not from this test), intra-project only;
imports under ``if TYPE_CHECKING:`` never run and are left out. Parsing needs no GPU,
so every module is read; only ``__main__`` scripts are skipped.

Then every module is really imported, each alone: in a child forked from an interpreter
that holds no project module (only the big third-party libraries, preloaded once so the
test takes seconds, not minutes), so a module that works only because another project
module was imported first fails here. schemas/ modules are imported in fresh interpreters
with nothing preloaded, and must leave no torch, vLLM or DeepSpeed in ``sys.modules``.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "cluster", "learner", "sandbox_workers", "schemas", "skills")
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


# ---------------------------------------------------------------------------------------------
# Each module imported alone.

# Not imported (every other module of PACKAGES is), each with its reason.
NOT_IMPORTED = {
    "cluster.tasks.builtin": "task files (data): read by path and run in the filter's or evaluator's sandbox",
    "cluster.launch.bench_learning_tasks": "`bench learning`'s task files and solutions (data): read by path",
    "skills.examples": "example solutions: workspaces the evaluator builds, each importing its own `krl`",
    "skills.templates": "workspace templates: `import krl` resolves only inside a candidate's built workspace",
}
# Third-party libraries the import server loads once before forking (no project module among them).
PRELOAD = ("numpy", "msgpack", "kafka", "torch")
PARALLEL = 4
MODULE_TIMEOUT_S = 60.0

# The import server: reads {"packages", "preload", "modules", "parallel", "timeout_s"} on stdin, preloads,
# checks that no project module is loaded, then forks one child per module (``parallel`` at a time); each
# child imports its module and reports {"ok", "error", "heavy", "before", "s"} through a pipe.
_SERVER = r"""
import importlib, json, os, signal, sys, time, traceback

job = json.load(sys.stdin)
packages = tuple(job["packages"])


def project_loaded():
    return sorted(m for m in sys.modules if m.split(".")[0] in packages)


for name in job["preload"]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
preloaded = project_loaded()
if preloaded:
    sys.exit(f"the preload imported project modules: {preloaded}")


def child(mod, w):
    t0 = time.monotonic()
    out = {"before": project_loaded()}
    try:
        if out["before"]:
            raise RuntimeError("project modules already loaded")
        importlib.import_module(mod)
        out["ok"] = True
    except BaseException as exc:
        out["ok"] = False
        out["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-1500:]
    out["heavy"] = sorted(h for h in ("torch", "vllm", "deepspeed") if h in sys.modules)
    out["s"] = round(time.monotonic() - t0, 3)
    os.write(w, json.dumps(out).encode()[:60000])
    os._exit(0)


todo, running, results = list(job["modules"]), {}, {}
sys.stdout.flush()
sys.stderr.flush()
while todo or running:
    while todo and len(running) < job["parallel"]:
        mod = todo.pop(0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)  # a module printing at import must not garble the report
            child(mod, w)
        os.close(w)
        running[pid] = (mod, r, time.monotonic())
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == 0:
        now = time.monotonic()
        for p, (mod, r, t0) in list(running.items()):
            if now - t0 > job["timeout_s"]:
                os.kill(p, signal.SIGKILL)
        time.sleep(0.005)
        continue
    mod, r, t0 = running.pop(pid)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    try:
        results[mod] = json.loads(b"".join(chunks))
    except ValueError:
        results[mod] = {"ok": False, "error": f"the child died (wait status {status}) after "
                        f"{time.monotonic() - t0:.1f} s without a report (timeout {job['timeout_s']} s?)"}
print(json.dumps(results))
"""


def _importable() -> list[str]:
    """Every module of PACKAGES that is imported alone: all but NOT_IMPORTED's and test files."""
    out = []
    for mod, path in _modules().items():
        if path.name.startswith("test_") or path.name == "conftest.py":
            continue
        if any(mod == skip or mod.startswith(skip + ".") for skip in NOT_IMPORTED):
            continue
        out.append(mod)
    return out


def _import_alone(modules: list[str], preload=PRELOAD, parallel: int = PARALLEL) -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSTARTUP", "PYTHONINSPECT")}
    env["PYTHONPATH"] = str(ROOT)
    env["CUDA_VISIBLE_DEVICES"] = ""  # importing must not need a GPU
    job = {"packages": list(PACKAGES), "preload": list(preload), "modules": modules, "parallel": parallel,
           "timeout_s": MODULE_TIMEOUT_S}
    proc = subprocess.run([sys.executable, "-c", _SERVER], input=json.dumps(job), capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_server_catches_a_module_that_needs_another_imported_first(tmp_path, monkeypatch):
    """A module that works only because a sibling was imported earlier fails alone (so the real check can)."""
    pkg = tmp_path / "actors"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import sys\nsys.modules['actors'].shared = 1\n")
    (pkg / "b.py").write_text("import actors\nvalue = actors.shared\n")
    (pkg / "c.py").write_text("from actors import a\nvalue = a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    got = _import_alone(["actors.a", "actors.b", "actors.c"], preload=(), parallel=1)
    assert got["actors.a"]["ok"] and got["actors.c"]["ok"], got
    assert not got["actors.b"]["ok"] and "shared" in got["actors.b"]["error"], got
    assert all(r.get("before") == [] for r in got.values()), got


def test_every_module_imports_alone():
    modules = _importable()
    assert len(modules) > 100 and "cluster.bus.client" in modules and "sandbox_workers.filter_service" in modules
    t0 = time.monotonic()
    got = _import_alone(modules)
    took = time.monotonic() - t0
    failed = {m: r.get("error", "") for m, r in sorted(got.items()) if not r.get("ok")}
    assert not failed, "modules that fail to import alone:\n" + "\n".join(f"{m}: {e}" for m, e in failed.items())
    assert sorted(got) == sorted(modules)
    slow = sorted(((r["s"], m) for m, r in got.items()), reverse=True)[:5]
    print(f"{len(modules)} modules imported alone in {took:.1f} s; slowest: {slow}")


def test_schemas_modules_alone_load_no_torch_vllm_or_deepspeed():
    """Each schemas/ module in a fresh interpreter with nothing preloaded: no heavy library in sys.modules."""
    modules = [m for m in _importable() if m.split(".")[0] == "schemas"]
    assert "schemas" in modules and "schemas.codec" in modules
    got = _import_alone(modules, preload=())
    assert all(r.get("ok") for r in got.values()), got
    heavy = {m: r["heavy"] for m, r in got.items() if r["heavy"]}
    assert not heavy, f"schemas modules that load torch/vllm/deepspeed: {heavy}"
