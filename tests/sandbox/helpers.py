"""Tasks and candidate solutions for the sandbox tests: real KernelBench tasks at tiny shapes."""
from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def kernelbench_dir() -> Path:
    return Path(os.environ.get("KERNELRL_KERNELBENCH") or ROOT.parent / "shared" / "kernelbench")


# Verbatim copies shipped with the examples, used where ../shared/kernelbench is absent (the GPU
# machine gets only the repository); test_cuda_build.py checks they still equal the originals.
EXAMPLE_COPIES = {"level1/19_ReLU.py": "cuda_19_relu",
                  "level2/12_Gemm_Multiply_LeakyReLU.py": "cuda_12_Gemm_Multiply_LeakyReLU"}


def task_path(rel: str) -> Path:
    p = kernelbench_dir() / rel
    if not p.is_file() and rel in EXAMPLE_COPIES:
        return ROOT / "skills" / "examples" / EXAMPLE_COPIES[rel] / "model.py"
    return p


def shrunk_task(rel: str, **consts) -> str:
    """A KernelBench task's source with module-level shape constants replaced (e.g. batch_size=8)."""
    src = task_path(rel).read_text()
    for name, value in consts.items():
        src, n = re.subn(rf"^{name}\s*=.*$", f"{name} = {value!r}", src, flags=re.M)
        assert n == 1, f"{rel}: constant {name} not found"
    return src


RELU_TASK = ("level1/19_ReLU.py", {"batch_size": 8, "dim": 4096})
GEMM_TASK = ("level2/12_Gemm_Multiply_LeakyReLU.py", {"batch_size": 8, "in_features": 64, "out_features": 32})

RELU_CPP = r'''
#include <cstdint>
#include "krl_abi.h"
extern "C" void relu_f32(const float* x, float* y, int64_t n) {
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
KRL_OP(relu_f32, "const f32* x, f32* y, i64 n")
'''

RELU_PY = '''
import torch
import torch.nn as nn
import krl

ops = krl.ops()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        y = torch.empty_like(x)
        ops.relu_f32(x, y, x.numel())
        return y
'''


def relu_solution(py: str = RELU_PY, cpp: str = RELU_CPP) -> dict[str, str]:
    return {"model_new.py": py, "kernels/relu.cpp": cpp}


def relu_with_body(body: str, extra_cpp: str = "", includes: str = "") -> dict[str, str]:
    """The ReLU solution with a different C++ kernel body (x, y, n in scope)."""
    cpp = f'''
#include <cstdint>
#include "krl_abi.h"
{includes}
{extra_cpp}
extern "C" void relu_f32(const float* x, float* y, int64_t n) {{
{body}
}}
KRL_OP(relu_f32, "const f32* x, f32* y, i64 n")
'''
    return relu_solution(cpp=cpp)


def relu_with_forward(forward_body: str, header: str = "", init: str = "") -> dict[str, str]:
    """The ReLU solution with a different forward() body (x in scope, ops bound)."""
    py = f'''
import torch
import torch.nn as nn
import krl
{header}
ops = krl.ops()


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{init or "        pass"}

    def forward(self, x):
{forward_body}
'''
    return relu_solution(py=py)
