"""Standard solution formats on the CUDA backend (marker `gpu`; run with `make test-gpu` on the GPU machine):
a KernelBench solution building a __global__ kernel with load_inline(cuda_sources=...) and a CUDA-Agent workspace
(kernels/*.cu launcher + *_binding.cpp registered through binding_registry.h) are built by the compile path,
verified and timed like kernelrl's own format; a cheat in either format is still refused."""
from __future__ import annotations

import copy

import pytest

from sandbox_workers import compiler, formats
from tests.sandbox.helpers import RELU_TASK, shrunk_task
from tests.sandbox.kernelbench_cases import RELU_CUDA_AGENT, RELU_KB_CUDA

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cuda_ev(sb_cfg):
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.eval_timeout_s = 120.0
    # load_inline's sources include torch/extension.h: g++ alone took over 60 s on the H200 host (2026-12-05)
    cfg.sandbox.compile_timeout_s = 300.0
    ev = Evaluator(cfg, "cuda")
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def task() -> str:
    return shrunk_task(RELU_TASK[0], **RELU_TASK[1])


def _why(res: dict) -> str:
    comp = res["evidence"].get("compile") or {}
    return f"{res['error']}\n{comp.get('log', '')[-4000:]}"


@pytest.mark.parametrize("fmt,files", [(formats.KERNELBENCH, {"model_new.py": RELU_KB_CUDA}),
                                       (formats.CUDA_AGENT, RELU_CUDA_AGENT)], ids=["kernelbench", "cuda_agent"])
def test_foreign_format_verified_and_timed_on_the_gpu(cuda_ev, task, sb_cfg, fmt, files):
    assert formats.detect(files) == fmt
    res = cuda_ev.evaluate(task, files, mode="both")
    print({k: res.get(k) for k in ("compiled", "correct", "reward", "speedup_vs_eager", "error")})
    assert res["compiled"] and res["correct"], _why(res)
    assert res["reward"] >= 1 and res["timings"]["candidate"]["median_s"] > 0, res
    again = compiler.compile_workspace(files, "cuda", sb_cfg)  # content-addressed: no second build
    assert again.ok and again.cached


def test_cuda_agent_binding_calling_torch_compute_is_refused(cuda_ev, task):
    files = dict(RELU_CUDA_AGENT)
    files["kernels/relu_binding.cpp"] = files["kernels/relu_binding.cpp"].replace(
        "auto y = torch::empty_like(xc);", "auto y = at::relu(xc); return y;")
    res = cuda_ev.evaluate(task, files, mode="verify")
    assert not res["correct"] and res["reward"] == -1.0, res
    assert "torch_compute" in res["violations"] or "torch_compute" in res["error"], _why(res)
