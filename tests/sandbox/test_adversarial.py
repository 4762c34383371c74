"""The static guards (guards.py) on the known reward hacks, and the oracle's basic verdicts.

The static guards are a first speed bump that tells an honest agent early what is not allowed;
the run-time defences (a separate judge with fresh secret inputs, the OS sandbox, the binary
policy) are exercised with the static guards off by test_redteam.py, where the cases that used
to live here (run-time torch compute, timer patching, caching, reading the evaluator's files,
timed calls checked, big outputs) now are.
"""
from __future__ import annotations

from tests.sandbox.helpers import relu_solution, relu_with_body, relu_with_forward


def rejected(res: dict, name: str) -> None:
    assert name in res["violations"], (res["violations"], res["error"], res["evidence"].get("violation_details"))
    assert res["correct"] is False and res["reward"] == -1.0


def test_honest_solution_is_correct(evaluator, relu_task):
    res = evaluator.evaluate(relu_task, relu_solution(), mode="verify")
    assert res["correct"] and res["reward"] == 1.0 and res["violations"] == [], res
    assert res["evidence"]["checks"] >= 5  # every correctness call compared by the judge


def test_known_wrong_solution_gets_minus_one(evaluator, relu_task):
    res = evaluator.evaluate(relu_task, relu_with_body("for (int64_t i = 0; i < n; ++i) y[i] = 2.f * x[i];"),
                             mode="verify")
    assert res["compiled"] and not res["correct"] and res["reward"] == -1.0 and "mismatch" in res["error"]


def test_compile_error_gets_minus_one(evaluator, relu_task):
    res = evaluator.evaluate(relu_task, relu_with_body("this is not C++;"), mode="verify")
    assert not res["compiled"] and res["reward"] == -1.0
    assert "error" in res["evidence"]["compile"]["log"]


# ---------------------------------------------------------------- torch compute in ModelNew
def test_torch_compute_static(evaluator, relu_task):
    rejected(evaluator.evaluate(relu_task, relu_with_forward("        return torch.relu(x)"), mode="verify"),
             "torch_compute")


def test_torch_in_cpp(evaluator, relu_task):
    sol = relu_with_body("", includes="#include <torch/extension.h>")
    res = evaluator.evaluate(relu_task, sol, mode="verify")
    rejected(res, "cpp_torch")
    assert not res["compiled"]


# ---------------------------------------------------------------- fallback / reference
def test_try_except_fallback(evaluator, relu_task):
    body = ("        try:\n            y = torch.empty_like(x)\n            ops.missing(x, y)\n            return y\n"
            "        except Exception:\n            return torch.relu(x)")
    rejected(evaluator.evaluate(relu_task, relu_with_forward(body), mode="verify"), "try_except_fallback")


def test_calling_reference_model(evaluator, relu_task):
    sol = relu_with_forward("        return self.ref(x)", header="from model import Model",
                            init="        self.ref = Model()")
    rejected(evaluator.evaluate(relu_task, sol, mode="verify"), "reference_model")


# ---------------------------------------------------------------- streams, threads (text rules)
def test_side_stream(evaluator, relu_task):
    body = "        s = torch.cuda.Stream()\n        y = torch.empty_like(x)\n        ops.relu_f32(x, y, x.numel())\n" \
           "        return y"
    rejected(evaluator.evaluate(relu_task, relu_with_forward(body), mode="verify"), "side_stream")


def test_threads_in_cpp(evaluator, relu_task):
    sol = relu_with_body("std::thread t([=]{ for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0; }); t.join();",
                         includes="#include <thread>")
    rejected(evaluator.evaluate(relu_task, sol, mode="verify"), "threads")


# ---------------------------------------------------------------- the shipped examples
def test_shipped_cpu_examples_verify(evaluator):
    from sandbox_workers import workspace
    from tests.sandbox.helpers import ROOT

    for d in sorted((ROOT / "skills" / "examples").glob("cpu_*")):
        res = evaluator.evaluate((d / "model.py").read_text(), workspace.read_dir(d), mode="verify")
        assert res["correct"] and res["reward"] == 1.0, (d.name, res["error"], res["violations"])
