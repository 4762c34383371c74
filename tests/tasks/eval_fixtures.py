"""A small task folder with known-good (fast and slow), known-bad and missing solutions.

Speed-ups are built far from 1 so fast_p is exact despite timing noise:
  1_ReluPlusDeadMatmul  reference = ReLU + 0 * (a 512^3 matmul's sum); the solution only does the ReLU
                        (OpenMP C++), many times faster than eager and torch.compile (the
                        matmul makes each reference call several ms, so the judge's own
                        clock, whose protocol overhead varies by a ms or so on a loaded CPU
                        host, cannot erase the gap).                                       correct, fast
  2_Relu                solution runs a single-threaded 96-step recurrence per element.   correct, slow
  3_ReluWide            solution returns |x| instead of ReLU.                               wrong
  4_Tanh                no solution.                                                        failed
"""
from __future__ import annotations

from pathlib import Path

_REF = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self{params}):
        super().__init__()
{init}

    def forward(self, x):
        return {expr}


def get_inputs():
    return [torch.randn({shape})]


def get_init_inputs():
    return [{init_inputs}]
'''

TASKS = {
    "1_ReluPlusDeadMatmul": _REF.format(params=", n", init="        self.w = nn.Parameter(torch.randn(n, n) * 0.01)",
                                        expr="torch.relu(x) + 0.0 * torch.matmul(self.w, self.w).sum()",
                                        shape="256, 1024", init_inputs="512"),
    "2_Relu": _REF.format(params="", init="", expr="torch.relu(x)", shape="256, 2048", init_inputs=""),
    "3_ReluWide": _REF.format(params="", init="", expr="torch.relu(x)", shape="64, 4096", init_inputs=""),
    "4_Tanh": _REF.format(params="", init="", expr="torch.tanh(x)", shape="64, 1024", init_inputs=""),
}

_MODEL_NEW = '''import torch
import torch.nn as nn

import krl

ops = krl.ops()


class ModelNew(nn.Module):
    def __init__(self{params}):
        super().__init__()
{init}

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        ops.{op}(x, y, x.numel())
        return y
'''

_KERNEL = '''#include <cstdint>
#include "krl_abi.h"

extern "C" void {op}(const float* __restrict__ x, float* __restrict__ y, int64_t n) {{
{body}
}}
KRL_OP({op}, "const f32* x, f32* y, i64 n")
'''

_FAST = '''#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) { float v = x[i]; y[i] = v > 0.0f ? v : 0.0f; }'''
_SLOW = '''  for (int64_t i = 0; i < n; ++i) {  // a 96-step recurrence that converges to relu(v): slow on purpose
    float r = x[i] > 0.0f ? x[i] : 0.0f, acc = 0.0f;
    for (int k = 0; k < 96; ++k) acc = acc * 0.5f + r * 0.5f;
    y[i] = acc;
  }'''
_WRONG = '''#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) { float v = x[i]; y[i] = v > 0.0f ? v : -v; }'''

SOLUTIONS = {
    "1_ReluPlusDeadMatmul": ("relu_fast", _FAST, ", n", "        self.w = nn.Parameter(torch.empty(n, n))"),
    "2_Relu": ("relu_slow", _SLOW, "", ""),
    "3_ReluWide": ("relu_wrong", _WRONG, "", ""),
}
EXPECTED = {"n": 4, "correct": 2, "pass_rate": 0.5, "fast_1_vs_eager": 0.25, "fast_1_vs_compile": 0.25}


def write(root: Path) -> tuple[Path, Path]:
    tasks, sols = root / "tasks", root / "solutions"
    (tasks / "level1").mkdir(parents=True)
    for name, src in TASKS.items():
        (tasks / "level1" / f"{name}.py").write_text(src)
    for name, (op, body, params, init) in SOLUTIONS.items():
        d = sols / name
        (d / "kernels").mkdir(parents=True)
        (d / "model_new.py").write_text(_MODEL_NEW.format(params=params, init=init or "        pass", op=op))
        (d / "kernels" / f"{op}.cpp").write_text(_KERNEL.format(op=op, body=body))
    return tasks, sols
