"""Solution formats end to end on the CPU backend: KernelBench load_inline built by the compile path (cached,
precompiled header), judged like kernelrl's own format; torch compute in C++ refused from the built binary."""
from __future__ import annotations

import pytest

from sandbox_workers import compiler, formats
from tests.sandbox.helpers import GEMM_TASK, shrunk_task
from tests.sandbox.kernelbench_cases import (COMPUTED_KB, GEMM_KB, MATMUL_KB, RELU_CUDA_AGENT, RELU_KB,
                                             RELU_KB_CUDA)


def _why(res: dict) -> str:
    """A failed evaluation's error with the compile log: every refused symbol, one per line."""
    comp = res["evidence"].get("compile") or {}
    return f"{res['error']}\n{comp.get('log', '')}"


def test_extract_reads_literals_and_constants():
    spec = formats.extract(GEMM_KB)
    assert spec.name == "gemm_fused" and spec.functions == ["gemm_mul_lrelu"]
    assert "gemm_mul_lrelu(torch::Tensor x" in spec.cpp_sources[0] and spec.var == "fused"
    assert formats.detect({"model_new.py": RELU_KB}) == formats.KERNELBENCH
    assert formats.detect({"model_new.py": RELU_KB, "kernels/a.cpp": ""}) == formats.KRL
    src = formats.extension_sources(formats.extract(RELU_KB))["kernels/main.cpp"]
    assert src.startswith("#include <torch/extension.h>") and 'm.def("relu_forward"' in src


def test_computed_source_refused_with_clear_error(sb_cfg):
    with pytest.raises(formats.FormatError, match=r"cpp_sources= must be .*computed at run time"):
        formats.extract(COMPUTED_KB)
    out = compiler.compile_workspace({"model_new.py": COMPUTED_KB}, "cpu", sb_cfg)
    assert not out.ok and "computed at run time" in out.error and "line" in out.error


def test_kernelbench_relu_level1_end_to_end(evaluator, relu_task, sb_cfg):
    files = {"model_new.py": RELU_KB}
    res = evaluator.evaluate(relu_task, files, mode="both")
    assert res["compiled"] and res["correct"], _why(res)
    assert res["reward"] >= 1 and res["timings"]["candidate"]["median_s"] > 0
    again = compiler.compile_workspace(files, "cpu", sb_cfg)  # content-addressed: no second build
    assert again.ok and again.cached


def test_kernelbench_gemm_level2_end_to_end(evaluator):
    task = shrunk_task(GEMM_TASK[0], **GEMM_TASK[1])
    res = evaluator.evaluate(task, {"model_new.py": GEMM_KB}, mode="both")
    assert res["compiled"] and res["correct"], _why(res)
    assert res["reward"] >= 1


def test_torch_matmul_in_cpp_refused_by_binary_policy(sb_cfg):
    out = compiler.compile_workspace({"model_new.py": MATMUL_KB}, "cpu", sb_cfg)
    assert not out.ok and "torch_compute" in out.violations
    assert "at::_ops::matmul::call" in out.log, out.log
    refused = [line for line in out.log.splitlines() if line.startswith(("torch_compute:", "forbidden_symbol:"))]
    assert refused and all("matmul" in line for line in refused), out.log  # contiguous, t, data_ptr: allowed


def test_convert_round_trip_builds(sb_cfg):
    from sandbox_workers import convert, workspace
    from tests.sandbox.helpers import ROOT

    src = workspace.read_dir(ROOT / "skills" / "examples" / "cpu_19_relu")
    kb = convert.to_kernelbench(src, "cpu")
    assert set(kb) == {"model_new.py"} and formats.detect(kb) == formats.KERNELBENCH
    assert formats.extract(kb["model_new.py"]).functions == ["relu_f32_t"]
    assert not formats.check_python(kb), formats.check_python(kb)
    assert convert.to_krl(kb) == src  # back, byte for byte
    out = compiler.compile_workspace(kb, "cpu", sb_cfg)  # the converted solution builds and passes the policy
    assert out.ok, out.error + out.log
    with pytest.raises(formats.FormatError.__mro__[1], match="not mechanical"):
        convert.to_krl({"model_new.py": RELU_KB})


def test_cuda_agent_workspace_planned_with_our_binding_infrastructure():
    carried = dict(RELU_CUDA_AGENT, **{"kernels/binding.cpp": "int evil = 1;", "kernels/binding_registry.h": "x"})
    assert formats.detect(carried) == formats.CUDA_AGENT
    plan = formats.plan(carried, "cuda")
    assert plan.fmt == formats.CUDA_AGENT and plan.module == "cuda_extension"
    assert "int evil" not in plan.sources["kernels/binding.cpp"]  # the fixed infrastructure is always ours
    assert "PYBIND11_MODULE" in plan.sources["kernels/binding.cpp"]
    assert plan.sources["kernels/krl_bindings_list.h"] == "KRL_BINDING_FN(relu)\n"
    assert {"kernels/relu.cu", "kernels/relu_binding.cpp"} <= set(plan.sources)
    assert not formats.check_python(carried), formats.check_python(carried)  # `import cuda_extension` is allowed
    # the text rules read the workspace's sources, not ours (ours use the registry's krl_ names; the H200 run of
    # 2026-12-05 refused the honest workspace for them), and a workspace file named like ours is still read
    assert not formats.check_cpp(carried, "cuda"), formats.check_cpp(carried, "cuda")
    hidden = dict(carried, **{"kernels/x/krl_bindings_list.h": "int krl_register_x;\n"})
    assert [v.name for v in formats.check_cpp(hidden, "cuda")] == ["sandbox_escape"]


@pytest.mark.parametrize("files", [RELU_CUDA_AGENT, {"model_new.py": RELU_KB_CUDA}], ids=["cuda_agent", "kb_cuda"])
def test_cuda_formats_on_the_cpu_backend_say_which_backend(sb_cfg, files):
    out = compiler.compile_workspace(files, "cpu", sb_cfg)
    assert not out.ok and "--backend cuda" in out.error, out.error
