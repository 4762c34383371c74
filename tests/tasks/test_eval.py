"""`kernelrl eval --policy solutions` through the sandbox's one-shot evaluator: exact pass rate and fast_p."""
from __future__ import annotations

import json

import pytest

from cluster.cli import main
from tests.tasks.eval_fixtures import EXPECTED, write


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    tasks, sols = write(root)
    out = root / "report"
    sets = {"broker.cache_dir": root / "cache", "sandbox.trials": 5, "sandbox.max_trials": 15,
            "sandbox.timing_budget_s": 0.3, "sandbox.warmup": 2, "sandbox.cpu_flush_mb": 8,
            "sandbox.eval_timeout_s": 120, "sandbox.compile_timeout_s": 120,
            "sandbox.suspicious_speedup": 1000.0}  # no re-verification runs: the speed-ups are large by design
    argv = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    rc = main([*argv, "eval", "--tasks", str(tasks), "--policy", "solutions", "--solutions", str(sols),
               "--backend", "cpu", "--workers", "2", "--out", str(out), "--json"])
    assert rc == 0
    return json.loads((out / "eval.json").read_text()), out


def test_exact_pass_rate_and_fast_p(report):
    rep, _ = report
    overall = rep["overall"]
    for key, want in EXPECTED.items():
        assert overall[key] == pytest.approx(want), (key, overall[key], rep["tasks"])
    # fast_0 is the pass rate (KernelBench); fast_p over ALL tasks
    assert overall["fast_p"]["eager"]["0"] == pytest.approx(0.5)
    assert rep["levels"]["1"]["n"] == 4


def test_per_task_outcomes(report):
    rep, _ = report
    by = {t["name"]: t for t in rep["tasks"]}
    fast, slow, wrong, missing = (by[n] for n in ("1_ReluPlusDeadMatmul", "2_Relu", "3_ReluWide", "4_Tanh"))
    assert fast["correct"] and fast["speedup_vs_eager"] > 1 and fast["speedup_vs_compile"] > 1
    assert slow["correct"] and slow["speedup_vs_eager"] < 1 and slow["speedup_vs_compile"] < 1
    assert wrong["compiled"] and not wrong["correct"]
    assert not missing["has_solution"] and not missing["correct"]
    # geomean over the two correct tasks only
    import math
    g = math.exp((math.log(fast["speedup_vs_eager"]) + math.log(slow["speedup_vs_eager"])) / 2)
    assert rep["overall"]["geomean_speedup_vs_eager"] == pytest.approx(g)


def test_results_streamed_as_they_finish(report):
    """results.jsonl holds every task (one line each, written as it finished) with the report's outcome."""
    rep, out = report
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(x["task_id"] for x in lines) == sorted(t["task_id"] for t in rep["tasks"])
    by = {t["task_id"]: t for t in rep["tasks"]}
    for x in lines:
        assert (x["correct"], x["reward"], x["has_solution"]) == tuple(by[x["task_id"]][k] for k in
                                                                        ("correct", "reward", "has_solution"))


def test_plot_is_written(report):
    _, out = report
    png = (out / "eval.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_shrunk_task_keeps_the_solution_found_by_its_source(tmp_path):
    """--shrink-inputs rewrites the task; a solution matched by its model.py (skills/examples-style) still runs."""
    from tests.tasks import eval_fixtures as fx

    src = fx._REF.format(params="", init="", expr="torch.relu(x)", shape="batch, dim", init_inputs="")
    src = src.replace("def get_inputs", "batch = 512\ndim = 4096\n\n\ndef get_inputs")
    (tmp_path / "tasks" / "level1").mkdir(parents=True)
    (tmp_path / "tasks" / "level1" / "19_ReLU.py").write_text(src)
    sol = tmp_path / "solutions" / "cpu_x_renamed"  # found only through its model.py
    (sol / "kernels").mkdir(parents=True)
    (sol / "model.py").write_text(src)
    (sol / "model_new.py").write_text(fx._MODEL_NEW.format(params="", init="        pass", op="relu_fast"))
    (sol / "kernels" / "relu_fast.cpp").write_text(fx._KERNEL.format(op="relu_fast", body=fx._FAST))
    out = tmp_path / "report"
    rc = main(["--set", f"broker.cache_dir={tmp_path / 'cache'}", "--set", "sandbox.trials=3",
               "--set", "sandbox.max_trials=5", "--set", "sandbox.timing_budget_s=0.2",
               "--set", "sandbox.compile_baseline=false",  # the lookup is under test, not the baselines
               "eval", "--tasks", str(tmp_path / "tasks"), "--solutions", str(tmp_path / "solutions"),
               "--backend", "cpu", "--only-solved", "--shrink-inputs", "65536", "--out", str(out), "--json"])
    assert rc == 0
    rep = json.loads((out / "eval.json").read_text())
    (task,) = rep["tasks"]
    assert task["has_solution"] and task["correct"], task
    assert rep["meta"]["shrunk"]["l1-19_ReLU"], rep["meta"]


def test_solution_found_by_its_task_source(tmp_path):
    """A skills/examples-style folder solves the task whose source its model.py holds, whatever the names."""
    from pathlib import Path

    from cluster.tasks.dataset import TaskEntry
    from cluster.tasks.evaluate import find_solution

    src = "import torch\n\nclass Model(torch.nn.Module):\n    pass\n"
    sol = tmp_path / "cuda_7_whatever"
    (sol / "kernels").mkdir(parents=True)
    (sol / "model.py").write_text(src + "\n")
    (sol / "model_new.py").write_text("# new\n")
    (sol / "kernels" / "k.cu").write_text("// k\n")

    def entry(source, backend="cuda"):
        return TaskEntry(task_id="t1", name="26_GELU_", file="level1/26_GELU_.py", backend=backend, level=1,
                         source="kernelbench", metadata={}, model_py=source)

    assert find_solution(Path(tmp_path), entry(src)) == {"model_new.py": "# new\n", "kernels/k.cu": "// k\n"}
    assert find_solution(Path(tmp_path), entry(src + "x = 1\n")) is None  # a different task
    assert find_solution(Path(tmp_path), entry(src, backend="cpu")) is None  # a CUDA solution is not a CPU one
