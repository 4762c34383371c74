"""Pre-started CUDA sessions hold nothing on the device until their job starts (marker `gpu`; `make test-gpu`).

The worker's memory admission (device_memory.budget_for) sets nothing aside for the pool's sessions: at the
defaults (4 jobs x a pool of 4) that was 16 GB of an 80 GB H100, enough to run KernelBench's largest level-1 tasks
alone. This is the fact it rests on: neither process of a waiting session has a CUDA context."""
from __future__ import annotations

import copy
import os
import time

import pytest

from sandbox_workers.device_gate import descendants
from tests.sandbox.helpers import RELU_TASK, shrunk_task
from tests.sandbox.kernelbench_cases import RELU_KB_CUDA

pytestmark = pytest.mark.gpu


def _device_state() -> tuple[set[int], int]:
    """NVML: the pids with a context on this worker's device, and the bytes in use on it."""
    import pynvml

    from sandbox_workers.device_gate import _nvml_handle

    pynvml.nvmlInit()
    try:
        h = _nvml_handle(pynvml)
        return ({p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)},
                int(pynvml.nvmlDeviceGetMemoryInfo(h).used))
    finally:
        pynvml.nvmlShutdown()


def test_pre_started_sessions_hold_no_device_memory(sb_cfg):
    import torch

    from sandbox_workers.evaluator import Evaluator

    torch.empty(1, device="cuda")  # this process's own context first, so that it is not counted below
    mine, _ = _device_state()
    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.jobs_per_device, cfg.sandbox.warm_pool, cfg.sandbox.warm_sessions = 2, 2, True
    cfg.sandbox.eval_timeout_s, cfg.sandbox.compile_timeout_s = 120.0, 300.0
    ev = Evaluator(cfg, "cuda")
    try:
        res = ev.evaluate(shrunk_task(RELU_TASK[0], **RELU_TASK[1]), {"model_new.py": RELU_KB_CUDA}, mode="verify")
        assert res["correct"], res["error"]
        pool = ev._ready["candidate"]
        assert len(pool) == 4 and all(s.alive() for s in pool)  # 2 jobs x a pool of 2, refilled after the job
        waiting = set(descendants([p.pid for s in pool for p in s.procs]))
        seen: set[int] = set()
        for _ in range(20):  # 20 s: the pairs import torch and wait for their spec; none may make a context
            pids, used_pooled = _device_state()
            seen |= pids & waiting
            time.sleep(1.0)
        assert all(s.alive() for s in pool)
    finally:
        ev.close()
    time.sleep(3.0)
    _, used_after = _device_state()
    assert not seen, f"pre-started session processes hold a CUDA context: {sorted(seen)}"
    # a context is ~0.5 GB: eight of them would show whether or not NVML lists this container's pids
    assert used_pooled - used_after < 256 << 20, (used_pooled, used_after)
    assert os.getpid() in mine or not mine, mine  # where NVML lists pids, it lists this process's context
