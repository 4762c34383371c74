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


def task_inputs_fn(source: str):
    """(get_inputs, get_init_inputs) of a task, with its nn.Module classes removed from the namespace.

    The candidate child regenerates inputs from seeds instead of loading them (big tasks
    have multi-GB inputs), without ever holding the reference Model.
    """
    ns: dict = {"__name__": "krl_task_inputs"}
    exec(compile(source, "<task>", "exec"), ns)  # noqa: S102 - the task file is trusted input
    for name in [k for k, v in ns.items() if isinstance(v, type) and issubclass(v, torch.nn.Module)]:
        del ns[name]
    return ns["get_inputs"], ns["get_init_inputs"]


def make_inputs(get_inputs, seed: int, device: str) -> list:
    seed_all(seed)
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in get_inputs()]


def input_digest(inputs) -> list:
    """Shape, dtype and float64 sum of each tensor input (scalars as-is): checks reproducibility."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            out.append([list(x.shape), str(x.dtype), float(x.double().sum()) if x.numel() else 0.0])
        else:
            out.append(repr(x))
    return out


def record_output(o: torch.Tensor, max_full: int, samples: int, gen: torch.Generator) -> dict:
    """The expected value of one output: in full when small, else at `samples` random positions."""
    o = o.detach()
    rec = {"shape": list(o.shape), "dtype": str(o.dtype),
           "nonfinite": int((~torch.isfinite(o)).sum()) if o.is_floating_point() else 0}
    if o.numel() <= max_full:
        rec["full"] = o.cpu()
    else:
        idx = torch.randint(0, o.numel(), (samples,), generator=gen)
        rec["idx"] = idx
        rec["vals"] = o.reshape(-1)[idx.to(o.device)].cpu()
    return rec


def timing_pool(get_inputs, seeds: list[int], device: str) -> list[list]:
    """Input sets the timing rotates through (copied in place into one set of buffers)."""
    return [make_inputs(get_inputs, s, device) for s in seeds[:2]]


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
