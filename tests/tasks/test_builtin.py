"""The shipped task set: >= 50 tasks made by the pipeline, CPU-sized ones runnable in milliseconds."""
from __future__ import annotations

import time
import types
from collections import Counter

import torch

from actors.cmd_tasks import BUILTIN
from cluster.tasks.dataset import load_tasks


def _load(src: str):
    mod = types.ModuleType("builtin_task")
    exec(compile(src, "<builtin>", "exec"), mod.__dict__)
    return mod


def test_builtin_set_is_large_and_covers_both_backends():
    entries = load_tasks(BUILTIN)
    by_backend = Counter(e.backend for e in entries)
    assert len(entries) >= 50 and by_backend["cpu"] >= 25 and by_backend["cuda"] >= 25
    assert len({e.task_id for e in entries}) == len(entries)
    assert {e.metadata["n_ops"] for e in entries} == {1, 2, 3, 4, 5}
    for e in entries:
        meta = e.metadata
        assert e.source == "synth" and meta["generator"].startswith("compose/")
        assert meta["decontam"]["max_similarity"] <= meta["decontam"]["threshold"]
        assert meta["filter"]["compiled"] is True  # passed the torch.compile rules
        if e.backend == "cuda":
            assert meta["verified_on"] in ("cuda", "cpu-twin") and 1.0 <= meta["est_gpu_ms"] <= 100.0


def test_cpu_builtin_tasks_run_eager_in_milliseconds():
    torch.set_num_threads(1)
    slow = []
    for e in load_tasks(BUILTIN, backend="cpu"):
        mod = _load(e.model_py)
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs())
        inputs = mod.get_inputs()
        with torch.no_grad():
            model(*inputs)  # warm-up
            t0 = time.perf_counter()
            out = model(*inputs)
            ms = (time.perf_counter() - t0) * 1e3
        assert torch.isfinite(out).all(), e.name
        if ms > 50:  # generous: the filter's window is 0.1-10 ms single-threaded on an idle core
            slow.append((e.name, round(ms, 1)))
    assert len(slow) <= 2, slow
