"""Pure logic and the sandbox primitives: reward, static guards, workspace, isolation, compile cache."""
from __future__ import annotations

import json

import pytest

from sandbox_workers import guards, workspace
from sandbox_workers.isolation import Limits, run_sandboxed, sandbox_env
from sandbox_workers.reward import milestone_reward
from tests.sandbox.helpers import RELU_PY, relu_solution, relu_with_body


@pytest.mark.parametrize("t,te,tc,expected", [
    (None, None, None, 1.0), (1.0, 1.0, 1.0, 1.0), (0.9, 1.0, 1.0, 3.0), (0.9, 1.0, 0.9, 2.0), (0.94, 1.0, 0.5, 2.0),
    (0.5, 1.0, 0.6, 3.0), (0.96, 1.0, 1.0, 1.0), (0.5, 1.0, 0.52, 2.0), (2.0, 1.0, 3.0, 1.0),
])
def test_milestone_reward(t, te, tc, expected):
    assert milestone_reward(True, True, t, te, tc, 0.05) == expected


def test_reward_fail_is_minus_one():
    assert milestone_reward(False, True, 0.1, 1.0, 1.0) == -1.0
    assert milestone_reward(True, False, 0.1, 1.0, 1.0) == -1.0


def test_clean_solution_passes_static_guards():
    assert guards.check_python(RELU_PY) == []
    assert guards.check_cpp(relu_solution(), "cpu") == []


@pytest.mark.parametrize("src,name", [
    ("import torch\nimport torch.nn.functional as F\nclass ModelNew: pass", "torch_compute"),
    ("import torch\nclass ModelNew:\n def forward(self, x):\n  return torch.relu(x)", "torch_compute"),
    ("import torch\nclass ModelNew:\n def forward(self, x):\n  try:\n   pass\n  except Exception:\n   pass",
     "try_except_fallback"),
    ("from model import Model\nclass ModelNew(Model): pass", "reference_model"),
    ("import threading\nclass ModelNew: pass", "threads"),
    ("import time\ntime.perf_counter = lambda: 0.0\nclass ModelNew: pass", "timer_patching"),
    ("import torch\nclass ModelNew:\n def f(self):\n  s = torch.cuda.Stream()", "side_stream"),
    ("import torch\nclass L(torch.Tensor): pass\nclass ModelNew: pass", "tensor_subclass"),
    ("class ModelNew:\n def f(self):\n  return open('model.py').read()", "reads_evaluator_files"),
    ("import gc\nclass ModelNew: pass", "introspection"),
    ("import subprocess\nclass ModelNew: pass", "sandbox_escape"),
    ("import torch\nclass ModelNew:\n def f(self, x):\n  return x.__class__", "introspection"),
])
def test_static_python_guards(src, name):
    assert name in guards.names(guards.check_python(src))


@pytest.mark.parametrize("body,inc,name", [
    ("", "#include <torch/extension.h>", "cpp_torch"),
    ("at::Tensor t;", "", "cpp_torch"),
    ("", "#include <fstream>", "forbidden_include"),
    ('std::thread t([]{}); t.join();', "", "threads"),
    ('system("ls");', "", "sandbox_escape"),
    ('FILE* f = fopen("model.py", "r");', "", "reads_evaluator_files"),
    ("cudaStream_t s; cudaStreamCreate(&s);", "", "side_stream"),
    ("cudaEvent_t e; cudaEventCreate(&e);", "", "timer_patching"),
    ('asm volatile("nop");', "", "sandbox_escape"),
])
def test_static_cpp_guards(body, inc, name):
    files = relu_with_body(body, includes=inc)
    assert name in guards.names(guards.check_cpp(files, "cuda"))


def test_comments_do_not_trip_cpp_guards():
    files = relu_with_body("// we never call system(\"x\") or fopen() here\n/* torch::relu */ y[0] = x[0];")
    assert guards.check_cpp(files, "cpu") == []


def test_workspace_validation():
    with pytest.raises(workspace.WorkspaceError, match="inside"):
        workspace.validate({"model_new.py": "", "../evil.cpp": ""}, "cpu")
    with pytest.raises(workspace.WorkspaceError, match="model_new.py is missing"):
        workspace.validate({"kernels/a.cpp": ""}, "cpu")
    with pytest.raises(workspace.WorkspaceError, match="byte limit"):
        workspace.validate({"model_new.py": "x" * (workspace.MAX_FILE_BYTES + 1)}, "cpu")
    kept = workspace.validate({"model_new.py": "", "kernels/a.cpp": "", "kernels/a.cu": "", "notes.txt": "",
                               "model.py": "evil"}, "cpu")
    assert sorted(kept) == ["kernels/a.cpp", "model_new.py"]


def test_isolation_blocks_network_and_kills_on_deadline(tmp_path):
    code = "import socket\ntry:\n socket.create_connection(('1.1.1.1', 53), timeout=3)\n print('NET')\n" \
           "except OSError as e:\n print('NONET', e.errno)\n"
    r = run_sandboxed(["python3", "-c", code], cwd=str(tmp_path), limits=Limits(wall_s=20), env=sandbox_env())
    assert r.network_isolated and "NONET" in r.stdout, r
    r = run_sandboxed(["sleep", "30"], cwd=str(tmp_path), limits=Limits(wall_s=1), env=sandbox_env())
    assert r.timed_out and r.wall_s < 10
    r = run_sandboxed(["python3", "-c", "b = bytearray(3 << 30)"], cwd=str(tmp_path),
                      limits=Limits(wall_s=20, memory_mb=512), env=sandbox_env())
    assert r.returncode != 0 and "MemoryError" in r.stderr


def test_env_of_children_carries_no_secrets(monkeypatch):
    monkeypatch.setenv("KRL__BUS__SASL_PASSWORD", "secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    env = sandbox_env()
    assert "KRL__BUS__SASL_PASSWORD" not in env and "AWS_SECRET_ACCESS_KEY" not in env


def test_compile_cache_hit_and_errors(sb_cfg):
    from sandbox_workers.compiler import compile_workspace

    files = relu_with_body("for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;")
    first = compile_workspace(files, "cpu", sb_cfg)
    assert first.ok and first.library.is_file(), first.error + first.log
    again = compile_workspace(dict(files, **{"model_new.py": "# edited python does not rebuild\n" + RELU_PY}),
                              "cpu", sb_cfg)
    assert again.ok and again.cached and again.key == first.key and again.duration_s < 0.5
    bad = compile_workspace(relu_with_body("y[0] = undefined_symbol;" * 2000), "cpu", sb_cfg)
    assert not bad.ok and "undefined_symbol" in bad.log and len(bad.log) <= sb_cfg.sandbox.max_output_chars + 200
    assert "krl-build-" not in bad.log  # temp paths stripped
    flags = compile_workspace(files, "cpu", sb_cfg, extra_flags=["-fplugin=evil.so"])
    assert not flags.ok and "not allowed" in flags.error
    torchy = compile_workspace(relu_with_body("", includes="#include <torch/extension.h>"), "cpu", sb_cfg)
    assert not torchy.ok and torchy.violations == ["cpp_torch"]


def test_shrink_task_caps_shape_constants():
    from sandbox_workers.stress import shrink_task
    from tests.sandbox.helpers import kernelbench_dir

    src = (kernelbench_dir() / "level1" / "5_Matrix_scalar_multiplication.py").read_text()
    out = shrink_task(src, cap=32)
    assert "M = 32" in out and "N = 32" in out and "s = 3.14" in out
    ns: dict = {}
    exec(compile(out, "t", "exec"), ns)
    assert list(ns["get_inputs"]()[0].shape) == [32, 32]


def test_inline_artifact_is_used_when_its_key_matches(sb_cfg, tmp_path):
    import copy

    from sandbox_workers.compiler import compile_workspace
    from sandbox_workers.evaluator import Evaluator

    files = relu_solution()
    built = compile_workspace(files, "cpu", sb_cfg)
    other = copy.deepcopy(sb_cfg)  # another host: empty artifact cache
    other.sandbox.artifact_cache_dir = str(tmp_path / "remote-artifacts")
    ev = Evaluator(other, "cpu")
    lib, info = ev._artifact(workspace.validate(files, "cpu"), built.library.read_bytes(), built.key)
    assert lib is not None and info["cached"] and lib.read_bytes() == built.library.read_bytes()
    # a key that does not match the sources is ignored: the worker builds itself
    lib2, info2 = ev._artifact(workspace.validate(relu_with_body("y[0] = 1.f;"), "cpu"), b"junk", built.key)
    assert lib2 is not None and not info2["cached"] and lib2.read_bytes() != b"junk"


def test_mutable_static_state_in_cpu_kernels_is_refused(sb_cfg):
    from sandbox_workers.compiler import compile_workspace

    counter = compile_workspace(relu_with_body("++g_calls; for (int64_t i = 0; i < n; ++i) y[i] = x[i];",
                                               extra_cpp="int64_t g_calls = 0;"), "cpu", sb_cfg)
    assert not counter.ok and counter.violations == ["mutable_global_state"] and "g_calls" in counter.log
    local = compile_workspace(relu_with_body("static int calls = 0; ++calls; y[0] = (float)calls;"), "cpu", sb_cfg)
    assert not local.ok and local.violations == ["mutable_global_state"]
    lut = compile_workspace(relu_with_body("for (int64_t i = 0; i < n; ++i) y[i] = x[i] * kLut[i & 3];",
                                           extra_cpp="static const float kLut[4] = {1.f, 1.f, 1.f, 1.f};"),
                            "cpu", sb_cfg)
    assert lut.ok, lut.error + lut.log
    # SIMD intrinsics inside an OpenMP region make g++ emit DW.ref.__gxx_personality_v0: writable, not state
    simd = compile_workspace(relu_with_body(
        "#pragma omp parallel for\n  for (int64_t i = 0; i < n / 4; ++i)\n"
        "    _mm_storeu_ps(y + 4 * i, _mm_max_ps(_mm_loadu_ps(x + 4 * i), _mm_setzero_ps()));\n"
        "  for (int64_t i = n / 4 * 4; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;",
        includes="#include <immintrin.h>"), "cpu", sb_cfg)
    assert simd.ok, simd.error + simd.log
    import subprocess
    assert "DW.ref.__gxx_personality_v0" in subprocess.run(["nm", "--defined-only", str(simd.library)],
                                                           capture_output=True, text=True).stdout
    tamper = compile_workspace(relu_with_body("y[0] = 0.f;", extra_cpp="static int krl_registry_head = 1;"),
                               "cpu", sb_cfg)
    assert not tamper.ok and "sandbox_escape" in tamper.violations


def test_noisy_baselines_are_measured_again_and_the_faster_kept(sandbox_cache, tmp_path):
    from sandbox_workers.backends.base import summarize
    from sandbox_workers.evaluator import Evaluator, keep_faster, noisy
    from tests.sandbox.conftest import fast_cfg
    from tests.sandbox.helpers import RELU_TASK, shrunk_task

    old = {"eager": {"median_s": 1.0, "cv": 0.5}, "compile": {"median_s": 0.2, "cv": 0.01}, "x": {"error": "e"}}
    new = {"eager": {"median_s": 0.3, "cv": 0.02}, "compile": {"median_s": 0.4, "cv": 0.01}}
    assert keep_faster(old, new) == {"eager": new["eager"], "compile": old["compile"]}  # failed runs: not kept
    steady = {"eager": {"median_s": 1.5, "cv": 0.02}}  # a noisy faster one is not kept over a steady one
    assert keep_faster(old, steady, 0.25)["eager"] == steady["eager"] and keep_faster(old, steady)["eager"] == old["eager"]
    assert noisy(old, 0.25) and not noisy(new, 0.25) and not noisy(old, 0.0)
    # noisy means the bulk is spread, not that a shared host added a few spikes (the reward reads medians)
    spiky = summarize([1.7e-3 + 1e-6 * (i % 5) for i in range(31)] + [6e-3])
    bimodal = summarize([1.7e-3, 3.4e-3] * 16)
    assert spiky["cv"] > 0.25 and spiky["spread"] < 0.01 and bimodal["spread"] > 0.25
    assert not noisy({"eager": spiky}, 0.25) and noisy({"eager": bimodal}, 0.25)

    src = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
    cfg = fast_cfg(sandbox_cache)
    cfg.sandbox.baseline_cache_dir = str(tmp_path / "baselines")
    cfg.sandbox.compile_baseline = False
    cfg.sandbox.baseline_max_cv = 1e-9  # every measurement counts as noisy: each use measures again
    ev = Evaluator(cfg, "cpu")
    try:
        first = ev.baselines(src)
        second = ev.baselines(src)
        assert not first["cached"] and not second["cached"]
        assert second["eager"]["median_s"] <= first["eager"]["median_s"]
        assert second["eager"]["trusted"]["gap_s"] > 0  # the judge's walls travel with the baseline
        ev.sb.baseline_max_cv = 0.0  # off: the stored baseline is used as it is
        third = ev.baselines(src)
        assert third["cached"] and third["eager"] == second["eager"]
    finally:
        ev.close()


def test_a_noisy_fresh_baseline_is_timed_again_before_this_evaluation_reads_it(sandbox_cache, tmp_path, monkeypatch):
    """The one-shot path: a burst of load while the baselines were timed inflates their medians, and this very
    evaluation's reward would read them (a forged claim reached the top tier that way in CI): one more measurement
    at once, the faster of each variant kept; a steady one is not measured twice."""
    from sandbox_workers.evaluator import Evaluator
    from tests.sandbox.conftest import fast_cfg

    cfg = fast_cfg(sandbox_cache)
    cfg.sandbox.baseline_cache_dir = str(tmp_path / "baselines")
    ev = Evaluator(cfg, "cpu")
    runs = [({"eager": {"median_s": 9.8e-3, "cv": 0.9}, "compile": {"median_s": 13.9e-3, "cv": 1.05}}, {}),
            ({"eager": {"median_s": 6.0e-3, "cv": 0.03}, "compile": {"median_s": 6.2e-3, "cv": 0.04}}, {}),
            ({"eager": {"median_s": 5.0e-3, "cv": 0.02}}, {})]
    calls = []
    monkeypatch.setattr(ev, "_measure_baselines", lambda src: calls.append(src) or runs.pop(0))
    try:
        got = ev.baselines("noisy task")
        assert calls == ["noisy task"] * 2
        assert got["eager"]["median_s"] == 6.0e-3 and got["compile"]["median_s"] == 6.2e-3
        steady = ev.baselines("steady task")
        assert calls[2:] == ["steady task"] and steady["eager"]["median_s"] == 5.0e-3
    finally:
        ev.close()


def test_a_speed_tier_is_paid_only_after_the_baselines_were_timed_twice(sandbox_cache, tmp_path, monkeypatch):
    """A burst of load during the one measurement of a task's baselines inflates eager and compile alike (no spread
    to see it by), and a candidate then reaches a tier it does not deserve: the first speed tier against a cache
    entry has the baselines timed once more, the faster of each kept and the entry marked confirmed; later tiers
    against it cost nothing more, and rewards of 1 never trigger it."""
    from pathlib import Path

    from sandbox_workers.evaluator import Evaluator
    from tests.sandbox.conftest import fast_cfg

    cfg = fast_cfg(sandbox_cache)
    cfg.sandbox.baseline_cache_dir = str(tmp_path / "baselines")
    cfg.sandbox.static_guards = False
    cfg.sandbox.cpu_charge_compressible = False
    ev = Evaluator(cfg, "cpu")
    runs = [({"eager": {"median_s": 9.0e-3, "cv": 0.02}, "compile": {"median_s": 9.5e-3, "cv": 0.02}}, {}),
            ({"eager": {"median_s": 3.6e-3, "cv": 0.02}, "compile": {"median_s": 3.9e-3, "cv": 0.02}}, {})]
    calls = []
    claims = [4.0e-3, 3.0e-3, 4.0e-3]
    monkeypatch.setattr(ev, "_measure_baselines", lambda src: calls.append(src) or runs.pop(0))
    monkeypatch.setattr(ev, "_artifact", lambda files, artifact, key: (Path("/nonexistent"), {}))
    monkeypatch.setattr(ev, "_candidate", lambda src, files, lib, timing: {
        "ok": True, "timing": {"median_s": claims.pop(0)}})
    files = {"model_new.py": "class ModelNew: pass\n"}
    try:
        first = ev.evaluate("task", files, "both")
        assert calls == ["task", "task"]  # measured, then timed again before the tier was paid
        assert first["evidence"]["baselines_confirmed"] == {"reward_before": 3.0, "reward": 1.0}
        assert first["reward"] == 1.0 and first["timings"]["eager"]["median_s"] == 3.6e-3
        meta = json.loads(next((tmp_path / "baselines").glob("*/baselines.json")).read_text())
        assert meta["confirmed"] and meta["eager"]["median_s"] == 3.6e-3 and meta["compile"]["median_s"] == 3.9e-3
        second = ev.evaluate("task", files, "both")  # a true tier against confirmed baselines: nothing measured
        assert second["reward"] == 3.0 and "baselines_confirmed" not in second["evidence"] and len(calls) == 2
        third = ev.evaluate("task", files, "both")
        assert third["reward"] == 1.0 and len(calls) == 2
    finally:
        ev.close()
