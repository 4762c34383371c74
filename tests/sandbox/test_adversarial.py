"""One test per known reward hack (REFERENCE.md section 2): each is rejected with its violation name.

Static checks catch most hacks before anything runs; the `nostatic` evaluator
switches them off to prove the run-time guards in the child catch the same
hack on their own.
"""
from __future__ import annotations

import copy

import pytest

from tests.sandbox.helpers import relu_solution, relu_with_body, relu_with_forward


@pytest.fixture(scope="module")
def nostatic(sb_cfg):
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.static_guards = False
    ev = Evaluator(cfg, "cpu")
    yield ev
    ev.close()


def rejected(res: dict, name: str) -> None:
    assert name in res["violations"], (res["violations"], res["error"], res["evidence"].get("violation_details"))
    assert res["correct"] is False and res["reward"] == -1.0


def test_honest_solution_is_correct(evaluator, relu_task):
    res = evaluator.evaluate(relu_task, relu_solution(), mode="verify")
    assert res["correct"] and res["reward"] == 1.0 and res["violations"] == [], res
    assert len(res["evidence"]["trials"]) >= 5 and len({t["seed"] for t in res["evidence"]["trials"]}) >= 5
    assert res["evidence"]["network_isolated"]


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


def test_torch_compute_runtime(nostatic, relu_task):
    # a tensor method is invisible to the static check: the dispatch guard refuses it
    rejected(nostatic.evaluate(relu_task, relu_with_forward("        return x.clamp(min=0)"), mode="verify"),
             "torch_compute")


def test_functional_runtime(nostatic, relu_task):
    sol = relu_with_forward("        return F.relu(x)", header="import torch.nn.functional as F")
    rejected(nostatic.evaluate(relu_task, sol, mode="verify"), "torch_compute")


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


def test_reference_unreachable_at_runtime(nostatic, relu_task):
    # even without static checks the reference model is not importable in the candidate process
    sol = relu_with_forward("        return self.ref(x)", header="from model import Model",
                            init="        self.ref = Model()")
    res = nostatic.evaluate(relu_task, sol, mode="verify")
    assert not res["correct"] and res["reward"] == -1.0 and "model" in res["error"].lower()


# ---------------------------------------------------------------- streams, threads, timers
def test_side_stream(evaluator, relu_task):
    body = "        s = torch.cuda.Stream()\n        y = torch.empty_like(x)\n        ops.relu_f32(x, y, x.numel())\n" \
           "        return y"
    rejected(evaluator.evaluate(relu_task, relu_with_forward(body), mode="verify"), "side_stream")


def test_threads_runtime(nostatic, relu_task):
    body = ("        y = torch.empty_like(x)\n        t = threading.Thread(target=ops.relu_f32, args=(x, y, x.numel()))\n"
            "        t.start()\n        t.join()\n        return y")
    rejected(nostatic.evaluate(relu_task, relu_with_forward(body, header="import threading"), mode="verify"),
             "threads")


def test_threads_in_cpp(evaluator, relu_task):
    sol = relu_with_body("std::thread t([=]{ for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0; }); t.join();",
                         includes="#include <thread>")
    rejected(evaluator.evaluate(relu_task, sol, mode="verify"), "threads")


def test_timer_patching_runtime(nostatic, relu_task):
    header = "import time\ntime.perf_counter = lambda: 0.0\ntorch.allclose = lambda *a, **k: True"
    sol = relu_with_forward("        y = torch.empty_like(x)\n        ops.relu_f32(x, y, x.numel())\n        return y",
                            header=header)
    rejected(nostatic.evaluate(relu_task, sol, mode="verify"), "timer_patching")


# ---------------------------------------------------------------- caching, mutation, aliasing
def test_output_caching_by_pointer_python(nostatic, relu_task):
    body = ("        k = x.data_ptr()\n        if k not in self.cache:\n            y = torch.empty_like(x)\n"
            "            ops.relu_f32(x, y, x.numel())\n            self.cache[k] = y\n"
            "        return self.cache[k].clone()")
    rejected(nostatic.evaluate(relu_task, relu_with_forward(body, init="        self.cache = {}"), mode="verify"),
             "output_caching")


_CPP_CACHE = relu_with_body(
    # the kernel remembers the last input pointer and replays its saved result
    "if (x == g_last && (int64_t)g_saved.size() == n) { for (int64_t i = 0; i < n; ++i) y[i] = g_saved[i]; return; }\n"
    "g_saved.resize(n); for (int64_t i = 0; i < n; ++i) { y[i] = x[i] > 0.f ? x[i] : 0.f; g_saved[i] = y[i]; }\n"
    "g_last = x;", extra_cpp="#include <vector>\nstatic const float* g_last = nullptr;\nstatic std::vector<float> g_saved;")


def test_output_caching_by_pointer_cpp_static(evaluator, relu_task):
    # the built library is inspected: mutable static state is refused at compile time
    res = evaluator.evaluate(relu_task, _CPP_CACHE, mode="verify")
    rejected(res, "output_caching")
    assert not res["compiled"] and "g_last" in res["evidence"]["compile"]["log"]


def test_output_caching_by_pointer_cpp_runtime(nostatic, relu_task):
    rejected(nostatic.evaluate(relu_task, _CPP_CACHE, mode="verify"), "output_caching")


def test_input_mutation(evaluator, relu_task):
    body = "float* xm = (float*)x;\nfor (int64_t i = 0; i < n; ++i) { y[i] = x[i] > 0.f ? x[i] : 0.f; xm[i] = 0.f; }"
    rejected(evaluator.evaluate(relu_task, relu_with_body(body), mode="verify"), "input_mutation")


def test_output_aliases_input(evaluator, relu_task):
    rejected(evaluator.evaluate(relu_task, relu_with_forward("        ops.relu_f32(x, x, x.numel())\n        return x"),
                                mode="verify"), "output_aliases_input")


def test_tensor_subclass_runtime(nostatic, relu_task):
    header = "class Lazy(torch.Tensor):\n    pass\n"
    body = ("        y = torch.empty_like(x)\n        ops.relu_f32(x, y, x.numel())\n"
            "        return torch.Tensor._make_subclass(Lazy, y)")
    rejected(nostatic.evaluate(relu_task, relu_with_forward(body, header=header), mode="verify"), "tensor_subclass")


def test_reading_evaluator_files_runtime(nostatic, relu_task):
    init = ("        import sandbox_workers, os\n"
            "        self.leak = os.listdir(os.path.dirname(sandbox_workers.__file__))")
    rejected(nostatic.evaluate(relu_task, relu_with_forward("        return x", init=init), mode="verify"),
             "reads_evaluator_files")


def test_timed_calls_are_checked(sb_cfg, relu_task):
    # correct for the verification calls, then skips the work while being timed
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.compile_baseline = False  # the eager baseline is enough here; inductor is slow to start
    cfg.sandbox.static_guards = False  # else the static call counter is refused at compile time
    ev = Evaluator(cfg, "cpu")
    extra = "static int64_t g_calls = 0;"
    body = "if (++g_calls > 8) return;\nfor (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;"
    try:
        res = ev.evaluate(relu_task, relu_with_body(body, extra_cpp=extra), mode="both")
    finally:
        ev.close()
    rejected(res, "timed_output_mismatch")


def test_big_outputs_are_compared_at_random_positions(sb_cfg, relu_task):
    # outputs above max_full_output_elems are checked at sampled positions (+ NaN/Inf everywhere):
    # skipping 10% of the work is still caught
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.max_full_output_elems, cfg.sandbox.output_sample_elems = 1000, 2000
    ev = Evaluator(cfg, "cpu")
    try:
        honest = ev.evaluate(relu_task, relu_solution(), mode="verify")
        lazy = ev.evaluate(relu_task, relu_with_body(
            "for (int64_t i = 0; i < n; ++i) y[i] = (i % 10 == 7) ? 0.f : (x[i] > 0.f ? x[i] : 0.f);"),
            mode="verify")
        nan = ev.evaluate(relu_task, relu_with_body(
            "for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;\ny[n / 3 + 1] = 0.f / 0.f;"),
            mode="verify")
    finally:
        ev.close()
    assert honest["correct"], honest["error"]
    assert not lazy["correct"] and "sampled positions" in lazy["error"], lazy["error"]
    assert not nan["correct"] and "NaN/Inf" in nan["error"], nan["error"]


def test_shipped_cpu_examples_verify(evaluator):
    from sandbox_workers import workspace
    from tests.sandbox.helpers import ROOT

    for d in sorted((ROOT / "skills" / "examples").glob("cpu_*")):
        res = evaluator.evaluate((d / "model.py").read_text(), workspace.read_dir(d), mode="verify")
        assert res["correct"] and res["reward"] == 1.0, (d.name, res["error"], res["violations"])
