"""Run-time guards inside the evaluation child (backing up the static checks).

- a TorchDispatchMode around every ModelNew call: only tensor creation, views
  and copies may reach ATen (the custom kernels run outside the dispatcher);
- an audit hook (cannot be removed from Python) refusing reads of evaluator
  files and the reference data, processes, sockets and dynamic loading while
  candidate code runs;
- thread starts refused while candidate code runs;
- identity snapshots of timers, events, comparison functions and the runtime,
  checked after each phase (monkey-patching is reported, and the evaluator
  uses references bound before the candidate was imported anyway);
- a snapshot of the module's own Python state around forward (state kept
  across calls is how outputs get cached).
"""
from __future__ import annotations

import os
import threading

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox_workers import guards

ALLOWED_ATEN = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "zero_", "fill_", "arange",
    "scalar_tensor", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t", "transpose",
    "permute", "expand", "squeeze", "unsqueeze", "detach", "detach_", "alias", "select", "slice", "split",
    "split_with_sizes", "unbind", "narrow", "clone", "copy_", "contiguous", "lift_fresh", "lift_fresh_copy",
    "_local_scalar_dense", "resize_", "is_same_size", "sym_size", "sym_stride", "sym_numel",
}


class GuardTripped(BaseException):
    """Raised inside candidate code when a guard refuses an action (not catchable by `except Exception`)."""


class Recorder:
    def __init__(self):
        self.found: list[guards.Violation] = []
        self.active = False

    def add(self, name: str, detail: str) -> None:
        if len(self.found) < 50 and guards.Violation(name, detail) not in self.found:
            self.found.append(guards.Violation(name, detail))


class ComputeGuard(TorchDispatchMode):
    """Refuse ATen compute while ModelNew runs."""

    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in ALLOWED_ATEN:
            self.rec.add(guards.TORCH_COMPUTE, f"torch op {name} called inside ModelNew")
            raise GuardTripped(f"torch compute op {name} is not allowed in ModelNew")
        return func(*args, **(kwargs or {}))


def install_audit(rec: Recorder, deny_paths: list[str], allow_dlopen: set[str]) -> None:
    deny = [os.path.realpath(p) for p in deny_paths if p]

    def denied(path) -> bool:
        if isinstance(path, int):
            return False
        try:
            p = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return os.path.basename(p) == "model.py" or any(p == d or p.startswith(d + os.sep) for d in deny)

    def hook(event: str, args) -> None:
        if not rec.active:
            return
        if event in ("open", "os.listdir", "os.scandir", "glob.glob", "shutil.copyfile", "os.chdir"):
            if args and denied(args[0]):
                rec.add(guards.READS_EVALUATOR_FILES, f"{event} {args[0]!r}")
                raise GuardTripped(f"access to {args[0]!r} is not allowed")
        elif event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                       "os.forkpty", "socket.connect", "socket.bind", "socket.__new__", "os.kill", "os.killpg",
                       "pty.spawn", "webbrowser.open"):
            rec.add(guards.SANDBOX_ESCAPE, event)
            raise GuardTripped(f"{event} is not allowed")
        elif event == "ctypes.dlopen" and (not args or str(args[0]) not in allow_dlopen):
            rec.add(guards.SANDBOX_ESCAPE, f"ctypes.dlopen {args[0] if args else ''}")
            raise GuardTripped("loading libraries is not allowed")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys.settrace", "sys.setprofile",
                       "sys.addaudithook"):
            rec.add(guards.INTROSPECTION, event)
            raise GuardTripped(f"{event} is not allowed")

    import sys
    sys.addaudithook(hook)


def install_thread_guard(rec: Recorder) -> None:
    import _thread

    orig_start = threading.Thread.start
    orig_new = _thread.start_new_thread

    def start(self, *a, **k):
        if rec.active:
            rec.add(guards.THREADS, f"threading.Thread.start ({self.name})")
            raise GuardTripped("threads are not allowed")
        return orig_start(self, *a, **k)

    def new_thread(*a, **k):
        if rec.active:
            rec.add(guards.THREADS, "_thread.start_new_thread")
            raise GuardTripped("threads are not allowed")
        return orig_new(*a, **k)

    threading.Thread.start = start
    _thread.start_new_thread = new_thread


def protected_objects(runtime) -> dict[str, object]:
    """Objects whose identity must not change once candidate code has run."""
    import time

    objs = {f"time.{n}": getattr(time, n) for n in ("perf_counter", "perf_counter_ns", "monotonic",
                                                    "monotonic_ns", "time", "time_ns", "process_time")}
    objs.update({
        "torch.allclose": torch.allclose, "torch.equal": torch.equal, "torch.isfinite": torch.isfinite,
        "torch.Tensor.__eq__": torch.Tensor.__eq__, "torch.Tensor.clone": torch.Tensor.clone,
        "torch.Tensor.copy_": torch.Tensor.copy_, "torch.nn.Module.__call__": torch.nn.Module.__call__,
        "torch.cuda.Event": torch.cuda.Event, "torch.cuda.synchronize": torch.cuda.synchronize,
        "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
        "torch.cuda.Event.record": torch.cuda.Event.record, "torch.cuda.current_stream": torch.cuda.current_stream,
        "threading.Thread.start": threading.Thread.start,
    })
    for n in ("time_batch", "time_callable", "flush", "sync"):
        objs[f"runtime.{n}"] = getattr(type(runtime), n)
    return objs


def check_patched(rec: Recorder, snapshot: dict[str, object], runtime) -> None:
    now = protected_objects(runtime)
    for k, v in snapshot.items():
        if now.get(k) is not v:
            rec.add(guards.TIMER_PATCHING, f"{k} was replaced")
    for k in ("time_batch", "flush", "sync", "time_callable"):
        if k in vars(runtime):
            rec.add(guards.TIMER_PATCHING, f"runtime.{k} was replaced on the instance")


def state_fingerprint(module: torch.nn.Module) -> dict:
    """Non-parameter Python state of every submodule: a forward must leave it unchanged."""
    fp = {}
    for mname, m in module.named_modules():
        for k, v in vars(m).items():
            if k in ("_parameters", "_buffers", "_modules", "training", "_forward_hooks", "_forward_pre_hooks",
                     "_backward_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks"):
                continue
            fp[f"{mname}.{k}"] = _shallow(v)
        for k, b in m._buffers.items():
            fp[f"{mname}.buffer.{k}"] = (id(b), None if b is None else b.data_ptr())
        for k, p in m._parameters.items():
            fp[f"{mname}.param.{k}"] = (id(p), None if p is None else p.data_ptr())
    return fp


def _shallow(v):
    if isinstance(v, dict):
        return ("dict", id(v), len(v), tuple((k if isinstance(k, (int, str)) else id(k), id(x))
                                             for k, x in list(v.items())[:64]))
    if isinstance(v, (list, set)):
        return (type(v).__name__, id(v), len(v), tuple(id(x) for x in list(v)[:64]))
    if isinstance(v, torch.Tensor):
        return ("tensor", id(v), v.data_ptr())
    return ("obj", id(v))
