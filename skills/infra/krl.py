"""kernelrl fixed binding infrastructure (NOT editable by the agent): calls the built kernels.

Its imports have private names (`krl._torch`, `krl._ctypes`): ModelNew reaches only `ops()` and `device()`.

The evaluator builds ``kernels/`` into one shared library and binds it here
before ``model_new.py`` is imported. ``ops()`` returns an object with one
method per ``KRL_OP`` of the sources; each checks its tensor arguments
(dtype, device, contiguity) and passes raw pointers, so a call costs a few
microseconds and no torch C++ headers are ever compiled.
"""
from __future__ import annotations

import ctypes as _ctypes

import torch as _torch

_DTYPES = {
    "f32": _torch.float32, "f64": _torch.float64, "f16": _torch.float16, "bf16": _torch.bfloat16,
    "i8": _torch.int8, "u8": _torch.uint8, "i16": _torch.int16, "i32": _torch.int32,
    "i64": _torch.int64, "bool": _torch.bool,
}
_SCALARS = {"i32": _ctypes.c_int32, "i64": _ctypes.c_int64, "f32": _ctypes.c_float, "f64": _ctypes.c_double}


class KrlError(RuntimeError):
    """A kernel call with the wrong arguments, or no kernels bound."""


class _OpDesc(_ctypes.Structure):
    pass


_OpDesc._fields_ = [("name", _ctypes.c_char_p), ("sig", _ctypes.c_char_p), ("fn", _ctypes.c_void_p),
                    ("next", _ctypes.POINTER(_OpDesc))]

_STATE: dict = {"ops": None, "device": "cpu", "error": "kernels not built/bound (run the compile tool first)"}


def _parse_sig(name: str, sig: str) -> list[tuple[str, str, str]]:
    """'const f32* x, i64 n' -> [('ptr', 'f32', 'x'), ('scalar', 'i64', 'n')]."""
    params = []
    for raw in filter(None, (p.strip() for p in sig.split(","))):
        words = raw.replace("*", " * ").split()
        if words and words[0] == "const":
            words = words[1:]
        if len(words) >= 2 and words[1] == "*" and words[0] in _DTYPES:
            params.append(("ptr", words[0], words[2] if len(words) > 2 else f"arg{len(params)}"))
        elif words and words[0] in _SCALARS:
            params.append(("scalar", words[0], words[1] if len(words) > 1 else f"arg{len(params)}"))
        elif words and words[0] == "stream":
            params.append(("stream", "stream", "stream"))
        else:
            raise KrlError(f"op {name}: cannot parse parameter {raw!r} of signature {sig!r}")
    return params


class _Op:
    __slots__ = ("name", "params", "cfn", "device")

    def __init__(self, name: str, sig: str, addr: int, device: str):
        self.name, self.params, self.device = name, _parse_sig(name, sig), device
        argtypes = [_ctypes.c_void_p if kind in ("ptr", "stream") else _SCALARS[t] for kind, t, _ in self.params]
        self.cfn = _ctypes.CFUNCTYPE(None, *argtypes)(addr)

    def __call__(self, *args):
        user = [p for p in self.params if p[0] != "stream"]
        if len(args) != len(user):
            raise KrlError(f"{self.name}: expected {len(user)} arguments ({', '.join(p[2] for p in user)}), "
                           f"got {len(args)}")
        it = iter(args)
        cargs = []
        for kind, typ, pname in self.params:
            if kind == "stream":
                cargs.append(_torch.cuda.current_stream().cuda_stream)
                continue
            a = next(it)
            if kind == "scalar":
                if isinstance(a, _torch.Tensor):
                    raise KrlError(f"{self.name}: {pname} is a scalar {typ}; got a tensor")
                cargs.append(a)
                continue
            if not isinstance(a, _torch.Tensor):
                raise KrlError(f"{self.name}: {pname} must be a _torch.Tensor ({typ}*), got {type(a).__name__}")
            if a.dtype != _DTYPES[typ]:
                raise KrlError(f"{self.name}: {pname} must be {_DTYPES[typ]}, got {a.dtype}")
            if a.device.type != self.device:
                raise KrlError(f"{self.name}: {pname} must be on {self.device}, got {a.device}")
            if not a.is_contiguous():
                raise KrlError(f"{self.name}: {pname} must be contiguous (call .contiguous() first)")
            cargs.append(a.data_ptr())
        self.cfn(*cargs)


class _Ops:
    def __init__(self, table: dict[str, _Op]):
        self.__dict__.update(table)

    def __repr__(self) -> str:
        return "krl.ops(" + ", ".join(sorted(self.__dict__)) + ")"


def _bind(library_path: str, device: str = "cpu") -> None:
    """Evaluator only: load the built library and read its op registry."""
    lib = _ctypes.CDLL(library_path, mode=_ctypes.RTLD_LOCAL)
    lib.krl_ops.restype = _ctypes.POINTER(_OpDesc)
    table = {}
    node = lib.krl_ops()
    while node:
        d = node.contents
        name = d.name.decode()
        table[name] = _Op(name, d.sig.decode(), d.fn, device)
        node = d.next
    _STATE.update(ops=_Ops(table), device=device, lib=lib, error="")


def ops() -> _Ops:
    """The kernels of this workspace, one callable per KRL_OP."""
    if _STATE["ops"] is None:
        raise KrlError(_STATE["error"])
    return _STATE["ops"]


def device() -> str:
    """'cpu' or 'cuda': where the bound kernels expect their tensors."""
    return _STATE["device"]
