"""The CUDA backend on a real GPU (marker `gpu`; run with `make test-gpu` on the GPU machine).

- GPU identity: NVML UUID pinning before CUDA starts, the health check (and its refusal of a
  GPU that does not work), the clock-lock target read through NVML (read-only: the lent GPU's
  clocks are never changed by tests);
- the adversarial suite of test_adversarial.py on the CUDA backend, including the hacks that
  only exist there (work hidden on a side stream, pointer-keyed caches in device memory).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from tests.sandbox import cuda_cases
from tests.sandbox.helpers import RELU_TASK, ROOT, shrunk_task

pytestmark = pytest.mark.gpu

_PIN_SCRIPT = r'''
import json, os, sys
from sandbox_workers import gpu
ident = gpu.pin(0)
before = "torch" in sys.modules
import torch
props = torch.cuda.get_device_properties(0)
print(json.dumps({"env": os.environ["CUDA_VISIBLE_DEVICES"], "uuid": ident["uuid"], "name": ident["name"],
                  "torch_uuid": str(props.uuid), "count": torch.cuda.device_count(), "torch_before_pin": before,
                  "clock": gpu.clock_target(ident["handle"]), "health": gpu.health_check()}))
'''


def _py(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    full.update(PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=full,
                          timeout=300)


def test_pin_by_uuid_before_cuda_and_health():
    r = _py(_PIN_SCRIPT)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(out))
    assert out["env"] == out["uuid"] and out["uuid"].startswith("GPU-")
    assert not out["torch_before_pin"]
    assert out["count"] == 1
    assert out["uuid"].endswith(out["torch_uuid"].removeprefix("GPU-")), out  # torch sees the pinned GPU
    assert out["health"] == out["name"]
    clk = out["clock"]
    assert 0 < clk["target_sm_mhz"] <= clk["max_sm_mhz"] and clk["mem_mhz_now"] > 0


def test_pin_refuses_missing_gpu():
    r = _py("from sandbox_workers import gpu\ngpu.pin(64)")
    assert r.returncode != 0 and "--device 64" in r.stderr and "GPU(s)" in r.stderr


def test_health_check_refuses_unusable_gpu():
    code = ("from cluster.errors import SetupError\nfrom sandbox_workers import gpu\n"
            "try:\n    gpu.health_check(timeout_s=120)\nexcept SetupError as e:\n    print('REFUSED', e)\n")
    r = _py(code, env={"CUDA_VISIBLE_DEVICES": "GPU-00000000-0000-0000-0000-000000000000"})
    assert r.returncode == 0 and "REFUSED" in r.stdout and "refusing to serve" in r.stdout, r.stdout + r.stderr


# ---------------------------------------------------------------- adversarial suite on CUDA
@pytest.fixture(scope="module")
def cuda_ev(sb_cfg):
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.eval_timeout_s = 60.0
    ev = Evaluator(cfg, "cuda")
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def cuda_nostatic(sb_cfg):
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.static_guards = False
    cfg.sandbox.compile_baseline = False  # the eager baseline is enough for the timed hacks
    cfg.sandbox.eval_timeout_s = 60.0
    ev = Evaluator(cfg, "cuda")
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def task() -> str:
    return shrunk_task(RELU_TASK[0], **RELU_TASK[1])


def _forward(body: str, header: str = "", init: str = "", kernel: dict | None = None) -> dict[str, str]:
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
{body}
'''
    return {"model_new.py": py, "kernels/relu.cu": (kernel or cuda_cases.HONEST)["kernels/relu.cu"]}


_CALL = "        y = torch.empty_like(x)\n        ops.relu_f32(x, y, x.numel())\n        return y"


def rejected(res: dict, name: str) -> None:
    assert name in res["violations"], (res["violations"], res["error"], res["evidence"].get("violation_details"))
    assert res["correct"] is False and res["reward"] == -1.0


def test_honest_cuda_verify_and_evidence(cuda_ev, task):
    res = cuda_ev.evaluate(task, cuda_cases.HONEST, mode="verify")
    assert res["correct"] and res["reward"] == 1.0 and res["violations"] == [], res
    assert res["evidence"]["network_isolated"]
    clock = res["evidence"]["clock"]
    assert clock.get("uuid", "").startswith("GPU-") and clock["sm_clock_mhz"] > 0, clock


def test_torch_compute_static_cuda(cuda_ev, task):
    rejected(cuda_ev.evaluate(task, _forward("        return torch.relu(x)"), mode="verify"), "torch_compute")


def test_torch_compute_runtime_cuda(cuda_nostatic, task):
    rejected(cuda_nostatic.evaluate(task, _forward("        return x.clamp(min=0)"), mode="verify"), "torch_compute")


def test_functional_runtime_cuda(cuda_nostatic, task):
    sol = _forward("        return F.relu(x)", header="import torch.nn.functional as F")
    rejected(cuda_nostatic.evaluate(task, sol, mode="verify"), "torch_compute")


def test_side_stream_static_cuda(cuda_ev, task):
    body = "        s = torch.cuda.Stream()\n" + _CALL
    rejected(cuda_ev.evaluate(task, _forward(body), mode="verify"), "side_stream")


def test_side_stream_runtime_cuda(cuda_nostatic, task):
    # the kernel runs on one side stream: the timed stream's events see almost none of its ~2 ms per call.
    # (A fresh torch.cuda.Stream() per call rotates through torch's pool of 32 streams, so the hidden
    # kernels overlapped and the wall/event ratio stayed under the old threshold of 4 on the H200.)
    body = ("        y = torch.empty_like(x)\n        ops.spin_f32(100000)\n"
            "        with torch.cuda.stream(self.s):\n            ops.relu_f32(x, y, x.numel())\n        return y")
    sol = _forward(body, init="        self.s = torch.cuda.Stream()", kernel=cuda_cases.SLOW_RELU)
    rejected(cuda_nostatic.evaluate(task, sol, mode="both"), "side_stream")


def test_threads_runtime_cuda(cuda_nostatic, task):
    body = ("        y = torch.empty_like(x)\n        t = threading.Thread(target=ops.relu_f32, args=(x, y, x.numel()))\n"
            "        t.start()\n        t.join()\n        return y")
    rejected(cuda_nostatic.evaluate(task, _forward(body, header="import threading"), mode="verify"), "threads")


def test_timer_patching_runtime_cuda(cuda_nostatic, task):
    header = "torch.cuda.Event.elapsed_time = lambda self, end: 1e-6\ntorch.allclose = lambda *a, **k: True"
    rejected(cuda_nostatic.evaluate(task, _forward(_CALL, header=header), mode="verify"), "timer_patching")


def test_output_caching_python_cuda(cuda_nostatic, task):
    body = ("        k = x.data_ptr()\n        if k not in self.cache:\n            y = torch.empty_like(x)\n"
            "            ops.relu_f32(x, y, x.numel())\n            self.cache[k] = y\n"
            "        return self.cache[k].clone()")
    rejected(cuda_nostatic.evaluate(task, _forward(body, init="        self.cache = {}"), mode="verify"),
             "output_caching")


def test_output_caching_device_buffer_cuda(cuda_ev, task):
    rejected(cuda_ev.evaluate(task, cuda_cases.POINTER_CACHE, mode="verify"), "output_caching")


def test_timed_calls_are_checked_cuda(cuda_nostatic, task):
    rejected(cuda_nostatic.evaluate(task, cuda_cases.SKIP_WHEN_TIMED, mode="both"), "timed_output_mismatch")


def test_input_mutation_cuda(cuda_ev, task):
    rejected(cuda_ev.evaluate(task, cuda_cases.INPUT_MUTATION, mode="verify"), "input_mutation")


def test_output_aliases_input_cuda(cuda_ev, task):
    body = "        ops.relu_f32(x, x, x.numel())\n        return x"
    rejected(cuda_ev.evaluate(task, _forward(body), mode="verify"), "output_aliases_input")


def test_tensor_subclass_runtime_cuda(cuda_nostatic, task):
    header = "class Lazy(torch.Tensor):\n    pass\n"
    body = ("        y = torch.empty_like(x)\n        ops.relu_f32(x, y, x.numel())\n"
            "        return torch.Tensor._make_subclass(Lazy, y)")
    rejected(cuda_nostatic.evaluate(task, _forward(body, header=header), mode="verify"), "tensor_subclass")


def test_reading_evaluator_files_runtime_cuda(cuda_nostatic, task):
    init = ("        import sandbox_workers, os\n"
            "        self.leak = os.listdir(os.path.dirname(sandbox_workers.__file__))")
    rejected(cuda_nostatic.evaluate(task, _forward("        return x", init=init), mode="verify"),
             "reads_evaluator_files")


def test_reference_unreachable_cuda(cuda_nostatic, task):
    sol = _forward("        return self.ref(x)", header="from model import Model", init="        self.ref = Model()")
    res = cuda_nostatic.evaluate(task, sol, mode="verify")
    assert not res["correct"] and res["reward"] == -1.0 and "model" in res["error"].lower()


def test_worker_survives_crash_then_serves(cuda_ev, task):
    # an illegal address kills only its child; the same evaluator (and zygote) serves the next request
    bad = cuda_ev.evaluate(task, cuda_cases.ILLEGAL_ADDRESS, mode="verify")
    good = cuda_ev.evaluate(task, cuda_cases.HONEST, mode="verify")
    assert not bad["correct"] and bad["reward"] == -1.0
    assert good["correct"] and good["reward"] == 1.0, good
