"""Helpers shared by the reference and candidate children: task loading, seeding, output handling."""
from __future__ import annotations

import platform
import random
import types

import torch


def load_task(source: str) -> types.ModuleType:
    """Execute a KernelBench task file's source as module `krl_task` (never written next to the candidate)."""
    mod = types.ModuleType("krl_task")
    mod.__file__ = "<task>"
    exec(compile(source, "<task>", "exec"), mod.__dict__)  # noqa: S102 - the task file is trusted input
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(mod, name):
            raise ValueError(f"task file defines no {name}")
    return mod


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % (2 ** 32))
    except ImportError:
        pass


def to_device(values, device: str):
    return [v.to(device, copy=True) if isinstance(v, torch.Tensor) else v for v in values]


def flatten_outputs(out) -> list:
    """A model may return a tensor or a tuple/list of tensors."""
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def versions(runtime) -> dict:
    return {"torch": torch.__version__, "python": platform.python_version(), "device": runtime.device_name(),
            "cuda": torch.version.cuda or ""}


def timing_pool(trials: list[dict], device: str, n: int = 2) -> list[list]:
    """Input sets the timing rotates through (copied in place into one set of buffers)."""
    return [to_device(t["inputs"], device) for t in trials[:n]]


def make_prepare(live: list, pool: list[list]):
    """Before each trial: copy the next pool set into the live input buffers (same pointers, new content)."""
    state = {"i": 0}

    def prepare() -> int:
        idx = state["i"] % len(pool)
        state["i"] += 1
        for dst, src in zip(live, pool[idx]):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
        return idx

    return prepare
