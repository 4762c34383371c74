"""GPU pinning and health for an evaluation worker: NVML UUID -> CUDA_VISIBLE_DEVICES, clocks, health check.

Must run before anything in the process (or its children) initialises CUDA.
"""
from __future__ import annotations

import logging
import os

from cluster.errors import SetupError

log = logging.getLogger(__name__)


def pin(index: int) -> dict:
    """Pin this process (and its children) to GPU `index` by UUID; return its NVML identity."""
    try:
        import pynvml
    except ImportError:
        raise SetupError("eval-worker --device N needs nvidia-ml-py (pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        if not 0 <= index < count:
            raise SetupError(f"--device {index}: this machine has {count} GPU(s)")
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = pynvml.nvmlDeviceGetUUID(h)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
    except pynvml.NVMLError as exc:
        raise SetupError(f"NVML failed: {exc} (driver missing or GPU broken)") from None
    os.environ["CUDA_VISIBLE_DEVICES"] = uuid
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["KRL_GPU_NAME"] = name
    log.info("pinned to GPU %d %s (%s)", index, name, uuid)
    return {"index": index, "uuid": uuid, "name": name, "handle": h}


def clock_target(handle) -> dict:
    """Read-only: the SM clock `lock_clocks` would lock to, and the clocks now (NVML, no root needed)."""
    import pynvml

    mem = max(pynvml.nvmlDeviceGetSupportedMemoryClocks(handle))
    sm_max = max(pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem))
    # A base-ish clock the GPU can hold under load: 80% of the max supported (H200: ~1590 MHz),
    # rounded down to a clock the GPU actually supports.
    supported = sorted(pynvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem))
    target = max([c for c in supported if c <= int(sm_max * 0.8)] or supported[:1])
    return {"target_sm_mhz": target, "max_sm_mhz": sm_max, "max_mem_mhz": mem,
            "sm_mhz_now": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_mhz_now": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)}


def lock_clocks(handle) -> int | None:
    """Lock SM clocks at `clock_target` (root only; opt-in via sandbox.lock_clocks). Returns MHz or None."""
    import pynvml

    try:
        target = clock_target(handle)["target_sm_mhz"]
        pynvml.nvmlDeviceSetGpuLockedClocks(handle, target, target)
        log.info("SM clock locked at %d MHz", target)
        return target
    except pynvml.NVMLError as exc:
        log.warning("cannot lock clocks (%s); timings will be noisier", exc)
        return None


def unlock_clocks(handle) -> None:
    import pynvml

    try:
        pynvml.nvmlDeviceResetGpuLockedClocks(handle)
    except pynvml.NVMLError as exc:
        log.warning("cannot reset locked clocks: %s", exc)


HEALTH_SNIPPET = (
    "import torch\n"
    "a = torch.randn(1024, 1024, device='cuda'); b = a @ a; torch.cuda.synchronize()\n"
    "ref = (a.double().cpu() @ a.double().cpu()).float()\n"
    "assert torch.allclose(b.cpu(), ref, atol=1e-1, rtol=1e-2), 'matmul mismatch'\n"
    "print(torch.cuda.get_device_name())\n"
)


def health_check(timeout_s: float = 120.0) -> str:
    """Run a matmul on the pinned GPU in a child; raise SetupError when the GPU is unusable."""
    import subprocess
    import sys

    try:
        r = subprocess.run([sys.executable, "-c", HEALTH_SNIPPET], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SetupError(f"GPU health check hung for {timeout_s:.0f} s; refusing to serve") from None
    if r.returncode != 0:
        raise SetupError(f"GPU health check failed; refusing to serve: {r.stderr[-1500:]}")
    return r.stdout.strip()
