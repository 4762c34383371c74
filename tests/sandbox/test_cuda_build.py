"""The CUDA backend's build path without a GPU: nvcc (CUDA 13 from PyPI, requirements/test.txt)
compiles the shipped CUDA examples, the template and the CUDA test candidates; static guards
reject the CUDA-only hacks. Running them needs a GPU: see the `gpu`-marked test below."""
from __future__ import annotations

import pytest

from sandbox_workers import guards, workspace
from sandbox_workers.compiler import compile_workspace
from tests.sandbox import cuda_cases
from tests.sandbox.helpers import ROOT, RELU_TASK, shrunk_task

EXAMPLES = sorted((ROOT / "skills" / "examples").glob("cuda_*"))


def test_nvcc_is_available():
    from sandbox_workers.backends.cuda import cuda_home

    assert cuda_home() is not None, "nvcc missing: pip install -r requirements/test.txt"


@pytest.mark.parametrize("example", EXAMPLES + [ROOT / "skills" / "templates" / "cuda"], ids=lambda p: p.name)
def test_cuda_examples_build(sb_cfg, example):
    out = compile_workspace(workspace.read_dir(example), "cuda", sb_cfg)
    assert out.ok, out.error + "\n" + out.log
    assert out.library.stat().st_size > 0


@pytest.mark.parametrize("name", sorted(cuda_cases.COMPILABLE))
def test_cuda_candidates_build(sb_cfg, name):
    out = compile_workspace(cuda_cases.COMPILABLE[name], "cuda", sb_cfg)
    assert out.ok, out.error + "\n" + out.log


def test_cuda_side_stream_rejected_before_build(sb_cfg):
    out = compile_workspace(cuda_cases.SIDE_STREAM, "cuda", sb_cfg)
    assert not out.ok and "side_stream" in out.violations


def test_workspace_headers_are_the_fixed_ones(tmp_path):
    from actors.workspace import Workspace
    from sandbox_workers.workspace import FIXED_HEADERS, WorkspaceError, validate

    assert FIXED_HEADERS == {"krl_abi.h", "krl_math.h"}
    for name in sorted(FIXED_HEADERS):
        infra = (ROOT / "skills" / "infra" / name).read_text()
        for backend in ("cpu", "cuda"):
            ws = Workspace.create(tmp_path / backend, "ep", "class Model: pass\n", backend)
            assert (ws.root / name).read_text() == infra
            assert name in ws.protected
        with pytest.raises(WorkspaceError, match="fixed infrastructure"):  # a request cannot shadow one
            validate({f"kernels/{name}": "#pragma once\n"}, "cpu")


def test_examples_pass_static_guards():
    for d in sorted((ROOT / "skills" / "examples").iterdir()):
        files = workspace.read_dir(d)
        backend = d.name.split("_")[0]
        assert guards.check_python(files["model_new.py"]) == [], d
        assert guards.check_cpp(files, backend) == [], d


@pytest.mark.gpu
# input_mutation: the kernel writes into its own copy of the inputs; the judge keeps its own, so the outputs
# it checks are unaffected and the solution is correct (harmless since issue 11)
@pytest.mark.parametrize("name,expect", [("honest", None), ("wrong", "mismatch"), ("input_mutation", None),
                                         ("illegal_address", "crash"), ("hang", "deadline")])  # the rest: test_gpu_cuda.py
def test_cuda_candidates_on_gpu(sb_cfg, name, expect):
    import copy

    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.eval_timeout_s = 30.0
    ev = Evaluator(cfg, "cuda")
    try:
        res = ev.evaluate(shrunk_task(RELU_TASK[0], **RELU_TASK[1]), cuda_cases.COMPILABLE[name], mode="verify")
    finally:
        ev.close()
    if expect is None:
        assert res["correct"] and res["reward"] == 1.0, res
    else:
        assert not res["correct"] and res["reward"] == -1.0
        text = " ".join(res["violations"]) + " " + res["error"]
        assert expect in text or (expect == "crash" and ("SIG" in text or "illegal" in text.lower()
                                                         or "CUDA error" in text)), text


@pytest.mark.gpu
def test_cli_on_shipped_cuda_example(sandbox_cache, tmp_path):
    import json
    import subprocess

    from tests.conftest import KERNELRL
    from tests.sandbox.conftest import fast_sandbox

    ex = ROOT / "skills" / "examples" / "cuda_19_relu"
    task = tmp_path / "model.py"  # the example's task at a small shape (the full one is 6.4 GB per input)
    task.write_text(shrunk_task(RELU_TASK[0], batch_size=256, dim=16384))
    sets = [a for k, v in fast_sandbox(sandbox_cache).items() for a in ("--set", f"sandbox.{k}={v}")]
    r = subprocess.run([*KERNELRL, *sets, "sandbox", "eval", "--task", str(task), "--solution", str(ex),
                        "--backend", "cuda", "--json"], capture_output=True, text=True, cwd=ROOT, timeout=1200)
    why = f"rc {r.returncode}\nstdout (tail): {r.stdout[-3000:]}\nstderr (tail): {r.stderr[-3000:]}"
    assert r.stdout.strip(), why
    try:
        out = json.loads(r.stdout)
    except ValueError as exc:  # say what was printed instead of the result (a failure must show its cause)
        raise AssertionError(f"stdout is not the result's JSON: {exc}\n{why}") from None
    timings = out.get("timings") or {}
    assert out["correct"] and out["reward"] >= 1 and (timings.get("candidate") or {}).get("n", 0) >= 5, out
    assert all((timings.get(k) or {}).get("median_s", 0) > 0 for k in ("eager", "compile")), out


def test_cuda_examples_cover_ten_tasks():
    # the GPU proof (docs/oracle-gpu.md) evaluates every example; each ships its task file
    assert len(EXAMPLES) >= 10, [e.name for e in EXAMPLES]
    for d in EXAMPLES:
        assert (d / "model.py").is_file() and (d / "model_new.py").is_file() and list((d / "kernels").glob("*.cu")), d


def test_example_task_copies_are_verbatim():
    # the GPU tests read these copies when ../shared/kernelbench is not there
    from tests.sandbox.helpers import EXAMPLE_COPIES, kernelbench_dir

    for rel, example in EXAMPLE_COPIES.items():
        assert (ROOT / "skills" / "examples" / example / "model.py").read_text() == (kernelbench_dir() / rel).read_text()
