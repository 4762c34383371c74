"""msgpack codec for the message dataclasses, with validation on both ends.

Wire form: ``{"k": kind, "v": schema version, "d": {field: value}}``. A numpy
array becomes ``{"__nd__": [dtype, shape], "b": raw little-endian bytes}``, so
a 128k-token trajectory encodes and decodes without per-element work. Unknown
fields are ignored (a newer sender stays readable); a missing, mistyped or
oversized field raises ``SchemaError`` naming the field.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

import msgpack
import numpy as np

from schemas.messages import LIMITS, MESSAGE_TYPES

_ALLOWED_DTYPES = {"<i4", "<i8", "<f4", "<f8", "|u1", "<u2", "<f2", "|i1", "|b1", "<u4"}


class SchemaError(ValueError):
    """A message could not be encoded or decoded: bad bytes, wrong type, too large."""

    retriable = False


def _nd_to_wire(arr: np.ndarray) -> dict:
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and np.little_endian is False):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    arr = np.ascontiguousarray(arr)
    return {"__nd__": [arr.dtype.str, list(arr.shape)], "b": arr.tobytes()}


def _nd_from_wire(path: str, obj: dict) -> np.ndarray:
    try:
        (dtype, shape), raw = obj["__nd__"], obj["b"]
    except (KeyError, TypeError, ValueError):
        raise SchemaError(f"{path}: malformed array") from None
    if dtype not in _ALLOWED_DTYPES:
        raise SchemaError(f"{path}: array dtype {dtype!r} not allowed")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise SchemaError(f"{path}: bad array shape {shape!r}")
    n = int(np.prod(shape)) if shape else 1
    if n > LIMITS["max_array_elems"]:
        raise SchemaError(f"{path}: array of {n} elements exceeds limit {LIMITS['max_array_elems']}")
    dt = np.dtype(dtype)
    if not isinstance(raw, bytes) or len(raw) != n * dt.itemsize:
        raise SchemaError(f"{path}: array bytes do not match dtype {dtype} and shape {shape}")
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def to_plain(obj: Any) -> Any:
    """Make numpy scalars/arrays inside free-form dicts msgpack/JSON friendly."""
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj


encode_json_safe = to_plain


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _nd_to_wire(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    raise SchemaError(f"cannot encode value of type {type(obj).__name__}")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.lru_cache(maxsize=None)
def _required(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


def _check_size(path: str, value: Any) -> None:
    if isinstance(value, str) and len(value) > LIMITS["max_str_chars"]:
        raise SchemaError(f"{path}: string of {len(value)} chars exceeds limit {LIMITS['max_str_chars']}")
    if isinstance(value, bytes) and len(value) > LIMITS["max_bytes"]:
        raise SchemaError(f"{path}: {len(value)} bytes exceeds limit {LIMITS['max_bytes']}")
    if isinstance(value, (list, dict)) and len(value) > LIMITS["max_list_items"]:
        raise SchemaError(f"{path}: {len(value)} items exceeds limit {LIMITS['max_list_items']}")


def _convert(path: str, value: Any, typ: Any) -> Any:
    """Check ``value`` against the annotation ``typ`` and build nested objects."""
    _check_size(path, value)
    origin = typing.get_origin(typ)
    if typ is Any:
        return value
    if typ is np.ndarray:
        if not isinstance(value, dict) or "__nd__" not in value:
            raise SchemaError(f"{path}: expected an array, got {type(value).__name__}")
        return _nd_from_wire(path, value)
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected {typ.__name__} map, got {type(value).__name__}")
        return _build(typ, value, path)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise SchemaError(f"{path}: expected a list, got {type(value).__name__}")
        (item_t,) = typing.get_args(typ)[:1] or (Any,)
        return [_convert(f"{path}[{i}]", v, item_t) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{path}: expected a map, got {type(value).__name__}")
        _, val_t = typing.get_args(typ) or (Any, Any)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise SchemaError(f"{path}: map key {k!r} is not a string")
            out[k] = _convert(f"{path}.{k}", v, val_t)
        return out
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(typ):
            try:
                return _convert(path, value, option)
            except SchemaError:
                continue
        raise SchemaError(f"{path}: {value!r} matches none of {typ}")
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(f"{path}: expected float, got {type(value).__name__}")
        return float(value)
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{path}: expected int, got {type(value).__name__}")
        return value
    if typ in (str, bytes, bool):
        if type(value) is not typ:
            raise SchemaError(f"{path}: expected {typ.__name__}, got {type(value).__name__}")
        return value
    if typ is type(None):
        if value is not None:
            raise SchemaError(f"{path}: expected null")
        return None
    raise SchemaError(f"{path}: unsupported annotation {typ!r}")


def _build(cls: type, data: dict, path: str) -> Any:
    hints = _hints(cls)
    missing = _required(cls) - data.keys()
    if missing:
        raise SchemaError(f"{path}: missing required field(s) {sorted(missing)}")
    kwargs = {}
    for name, value in data.items():
        if name in hints:  # unknown fields are tolerated and dropped
            kwargs[name] = _convert(f"{path}.{name}", value, hints[name])
    return cls(**kwargs)


def _validate_outgoing(msg: Any) -> None:
    kind = getattr(type(msg), "KIND", None)
    if kind not in MESSAGE_TYPES or not isinstance(msg, MESSAGE_TYPES[kind]):
        raise SchemaError(f"cannot encode {type(msg).__name__}: not a registered message type")


def encode(msg: Any) -> bytes:
    """Serialize a message dataclass; validates it by decoding-rules first."""
    _validate_outgoing(msg)
    body = {"k": msg.KIND, "v": msg.VERSION, "d": msg}
    try:
        data = msgpack.packb(body, default=_default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SchemaError(f"{msg.KIND}: {exc}") from None
    # Round-trip the structure check on the small fields so a sender learns of a bad
    # message before a consumer dead-letters it.
    decode(data, expected=type(msg))
    return data


def decode(data: bytes, expected: type | None = None) -> Any:
    """Parse bytes into a message; raises SchemaError with the precise reason."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SchemaError(f"payload must be bytes, got {type(data).__name__}")
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False,
                               max_bin_len=LIMITS["max_bytes"], max_str_len=LIMITS["max_str_chars"])
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as exc:
        raise SchemaError(f"undecodable msgpack: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - msgpack raises assorted errors on garbage; all mean "bad bytes"
        raise SchemaError(f"undecodable msgpack: {type(exc).__name__}: {exc}") from None
    if not isinstance(body, dict) or not {"k", "v", "d"} <= body.keys():
        raise SchemaError("not a kernelrl message: expected keys k, v, d")
    kind, version, fields = body["k"], body["v"], body["d"]
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise SchemaError(f"unknown message kind {kind!r}")
    if not isinstance(version, int) or version < 1:
        raise SchemaError(f"{kind}: bad schema version {version!r}")
    cls = MESSAGE_TYPES[kind]
    if expected is not None and cls is not expected:
        raise SchemaError(f"expected {expected.KIND}, got {kind}")
    if not isinstance(fields, dict):
        raise SchemaError(f"{kind}: body must be a map")
    return _build(cls, fields, kind)
