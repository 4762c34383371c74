"""The CUDA backend on a real GPU (marker `gpu`; run with `make test-gpu` on the GPU machine).

- GPU identity: NVML UUID pinning before CUDA starts, the health check (and its refusal of a
  GPU that does not work), the clock-lock target read through NVML (read-only: the lent GPU's
  clocks are never changed by tests);
- the static guards on the CUDA backend, and the CUDA red-team subset (cuda_cases.REDTEAM, the
  counterpart of test_redteam.py): the kernel cheats as .cu (refused at build time by the binary
  policy), a device-side cache keyed by pointer, work hidden on a side stream, cudaStreamCreate,
  time claims forged through torch.cuda.Event, an illegal address, a hang.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest

from tests.sandbox import cuda_cases
from tests.sandbox import redteam_cases as rc
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


# ---------------------------------------------------------------- evaluators on CUDA
def _cuda_evaluator(sb_cfg, **kw):
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.eval_timeout_s = 60.0
    for k, v in kw.items():
        setattr(cfg.sandbox, k, v)
    return Evaluator(cfg, "cuda")


@pytest.fixture(scope="module")
def cuda_evs(sb_cfg):
    evs = {"cuda_static": _cuda_evaluator(sb_cfg),
           "cuda_nostatic": _cuda_evaluator(sb_cfg, static_guards=False),
           # the eager baseline only (inductor is slow to start), cached once even when noisy
           "cuda_timing": _cuda_evaluator(sb_cfg, static_guards=False, compile_baseline=False, baseline_max_cv=0.0),
           "cuda_deadline": _cuda_evaluator(sb_cfg, static_guards=False, eval_timeout_s=20.0)}
    yield evs
    for ev in evs.values():
        ev.close()


@pytest.fixture(scope="module")
def cuda_ev(cuda_evs):
    return cuda_evs["cuda_static"]


@pytest.fixture(scope="module")
def task() -> str:
    return shrunk_task(RELU_TASK[0], **RELU_TASK[1])


def rejected(res: dict, name: str) -> None:
    assert name in res["violations"], (res["violations"], res["error"], res["evidence"].get("violation_details"))
    assert res["correct"] is False and res["reward"] == -1.0


def test_honest_cuda_verify_and_evidence(cuda_ev, task):
    res = cuda_ev.evaluate(task, cuda_cases.HONEST, mode="verify")
    assert res["correct"] and res["reward"] == 1.0 and res["violations"] == [], res
    assert res["evidence"]["checks"] >= 5
    clock = res["evidence"]["clock"]
    assert clock.get("uuid", "").startswith("GPU-") and clock["sm_clock_mhz"] > 0, clock
    # the remote made its CUDA context as the job started, before the judge's first hold of the device
    made = res["evidence"]["phases"]["candidate"]["remote_context"]
    assert made["made_s"] > 0 and made["waited_s"] >= 0, made


def test_torch_compute_static_cuda(cuda_ev, task):
    rejected(cuda_ev.evaluate(task, cuda_cases.cuda_forward("return torch.relu(x)"), mode="verify"),
             "torch_compute")


def test_side_stream_static_cuda(cuda_ev, task):
    body = "s = torch.cuda.Stream()\n" + cuda_cases.CALL
    rejected(cuda_ev.evaluate(task, cuda_cases.cuda_forward(body), mode="verify"), "side_stream")


def test_worker_survives_crash_then_serves(cuda_ev, task):
    # an illegal address kills only the candidate's process; the same evaluator serves the next request
    bad = cuda_ev.evaluate(task, cuda_cases.ILLEGAL_ADDRESS, mode="verify")
    good = cuda_ev.evaluate(task, cuda_cases.HONEST, mode="verify")
    assert not bad["correct"] and bad["reward"] == -1.0
    assert good["correct"] and good["reward"] == 1.0, good


# ---------------------------------------------------------------- the CUDA red-team subset
def _items():
    for case in cuda_cases.REDTEAM:
        marks = [pytest.mark.xfail(strict=True, reason=case.hole)] if case.hole else []
        yield pytest.param(case, id=case.name, marks=marks)
    for ev in ("cuda_static", "cuda_nostatic", "cuda_timing", "cuda_deadline"):  # nothing left behind
        yield pytest.param(ev, id=f"honest-after-{ev}")


@pytest.mark.parametrize("item", list(_items()))
def test_cuda_redteam(item, cuda_evs, task):
    from sandbox_workers import guards

    if isinstance(item, str):
        res = cuda_evs[item].evaluate(task, cuda_cases.HONEST, mode="both" if item == "cuda_timing" else "verify")
        assert res["reward"] >= 1.0 and res["correct"] and res["violations"] == [], rc.describe(res)
        assert res["evidence"]["arena"] == "device", rc.describe(res)  # inputs and outputs stay on the GPU
        return
    case = item
    files = case.build(None)
    if case.ev == "cuda_static":
        assert guards.check_python(files["model_new.py"]) == [], "the Python text rules already refuse this case"
    if case.text_evades:
        assert guards.check_cpp(files, "cuda") == [], "the C++ text rules already refuse this case"
    res = cuda_evs[case.ev].evaluate(task, files, mode=case.mode)
    print(f"{case.name}: reward {res['reward']} violations {res['violations']} error {res['error'][:300]!r}")
    rc.check_outcome(case, res)
    if case.name.startswith("device_arena_"):  # the attack met the device arena, not the host fallback
        assert res["evidence"].get("arena") == "device", rc.describe(res)
