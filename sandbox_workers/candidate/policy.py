"""The no-torch-compute rule, checked inside the sandboxed candidate for the agent's benefit.

ModelNew may allocate, view and copy tensors; its arithmetic must run in the agent's own
kernels. A TorchDispatchMode around every call refuses any other ATen op, which tells an
honest agent at once what is wrong. It lives in the candidate's process, so a candidate
set on cheating can switch it off: the reward does not rest on it. What does (docs/sandbox.md):
fresh secret inputs for every call with every output checked by the judge, the judge's own
clock bounding the time claims, no compilers and no numpy in the sandbox, and the policy on
the built library's symbols.
"""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

TORCH_COMPUTE = "torch_compute"
ALLOWED_ATEN = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "zero_", "fill_", "arange",
    "scalar_tensor", "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t", "transpose",
    "permute", "expand", "squeeze", "unsqueeze", "detach", "detach_", "alias", "select", "slice", "split",
    "split_with_sizes", "unbind", "narrow", "clone", "copy_", "contiguous", "lift_fresh", "lift_fresh_copy",
    "_local_scalar_dense", "resize_", "is_same_size", "sym_size", "sym_stride", "sym_numel",
}


class GuardTripped(BaseException):
    """Raised inside candidate code when the rule refuses an op (not caught by `except Exception`)."""


class Recorder:
    def __init__(self):
        self.found: list[dict] = []

    def add(self, name: str, detail: str) -> None:
        v = {"name": name, "detail": detail}
        if len(self.found) < 50 and v not in self.found:
            self.found.append(v)


class ComputeGuard(TorchDispatchMode):
    """Refuse ATen compute while ModelNew runs."""

    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in ALLOWED_ATEN:
            self.rec.add(TORCH_COMPUTE, f"torch op {name} called inside ModelNew")
            raise GuardTripped(f"torch compute op {name} is not allowed in ModelNew")
        return func(*args, **(kwargs or {}))
