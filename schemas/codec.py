"""msgpack codec for the message dataclasses, with validation on both ends.

Wire form: ``{"k": kind, "v": schema version, "r": oldest reader version, "d": {field: value}}``. A numpy
array becomes ``{"__nd__": [dtype, shape], "b": raw little-endian bytes}``, so
a 128k-token trajectory encodes and decodes without per-element work. Unknown
fields are ignored (a newer sender that only added fields keeps "r" and stays
readable); a record whose "r" (else "v") is newer than the reader's version, or a
missing, mistyped or oversized field, raises ``SchemaError`` naming the reason.
"""
from __future__ import annotations

import dataclasses
import functools
import math
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
    if arr.dtype.str not in _ALLOWED_DTYPES:
        raise SchemaError(f"array dtype {arr.dtype.str!r} not allowed")
    # a byte view, not a copy: msgpack copies it once into the output buffer
    return {"__nd__": [arr.dtype.str, list(arr.shape)], "b": memoryview(arr.reshape(-1)).cast("B")}


def _nd_from_wire(path: str, obj: dict) -> np.ndarray:
    try:
        (dtype, shape), raw = obj["__nd__"], obj["b"]
    except (KeyError, TypeError, ValueError):
        raise SchemaError(f"{path}: malformed array") from None
    if dtype not in _ALLOWED_DTYPES:
        raise SchemaError(f"{path}: array dtype {dtype!r} not allowed")
    if (not isinstance(shape, list) or len(shape) > 8
            or not all(type(s) is int and s >= 0 for s in shape)):
        raise SchemaError(f"{path}: bad array shape {shape!r}")
    n = math.prod(shape)
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
    """msgpack fallback for values inside free-form (Any) fields."""
    if isinstance(obj, np.ndarray):
        return _nd_to_wire(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    raise SchemaError(f"cannot encode value of type {type(obj).__name__}")


# ---------------------------------------------------------------------------------------------
# Per-annotation converters, compiled once per type: ``dec(path, wire) -> value`` checks a
# decoded wire value and builds the field; ``enc(path, value) -> wire`` checks an outgoing
# field and turns it into msgpack-ready data. One walk each way, same error messages.

_MAX_STR, _MAX_BYTES, _MAX_ITEMS = LIMITS["max_str_chars"], LIMITS["max_bytes"], LIMITS["max_list_items"]


def _check_size(path: str, value: Any) -> None:
    t = type(value)
    if t is str:
        if len(value) > _MAX_STR:
            raise SchemaError(f"{path}: string of {len(value)} chars exceeds limit {_MAX_STR}")
    elif t is bytes:
        if len(value) > _MAX_BYTES:
            raise SchemaError(f"{path}: {len(value)} bytes exceeds limit {_MAX_BYTES}")
    elif t is list or t is dict:
        if len(value) > _MAX_ITEMS:
            raise SchemaError(f"{path}: {len(value)} items exceeds limit {_MAX_ITEMS}")


def _tname(value: Any) -> str:
    return type(value).__name__


def _scalar(typ: type):
    if typ is float:
        def dec(path, v):
            if type(v) is float:
                return v
            if type(v) is int:
                return float(v)
            raise SchemaError(f"{path}: expected float, got {_tname(v)}")

        def enc(path, v):
            if type(v) is float or type(v) is int or isinstance(v, (np.floating, np.integer)):
                return float(v)
            raise SchemaError(f"{path}: expected float, got {_tname(v)}")
        return dec, enc
    if typ is int:
        def dec(path, v):
            if type(v) is int:
                return v
            raise SchemaError(f"{path}: expected int, got {_tname(v)}")

        def enc(path, v):
            if type(v) is int:
                return v
            if isinstance(v, np.integer):
                return int(v)
            raise SchemaError(f"{path}: expected int, got {_tname(v)}")
        return dec, enc
    if typ is bool:
        def dec(path, v):
            if type(v) is bool:
                return v
            raise SchemaError(f"{path}: expected bool, got {_tname(v)}")

        def enc(path, v):
            if type(v) is bool or type(v) is np.bool_:
                return bool(v)
            raise SchemaError(f"{path}: expected bool, got {_tname(v)}")
        return dec, enc
    if typ is str:
        def dec(path, v):
            if type(v) is str:
                if len(v) > _MAX_STR:
                    _check_size(path, v)
                return v
            raise SchemaError(f"{path}: expected str, got {_tname(v)}")
        return dec, dec
    if typ is bytes:
        def dec(path, v):
            if type(v) is bytes:
                if len(v) > _MAX_BYTES:
                    _check_size(path, v)
                return v
            raise SchemaError(f"{path}: expected bytes, got {_tname(v)}")

        def enc(path, v):
            if isinstance(v, (bytearray, memoryview)):
                v = bytes(v)
            return dec(path, v)
        return dec, enc
    return None


def _any_dec(path, v):
    _check_size(path, v)
    return v


def _none_dec(path, v):
    if v is not None:
        raise SchemaError(f"{path}: expected null")
    return None


def _nd_enc(path: str, v: Any) -> dict:
    if not isinstance(v, np.ndarray):
        raise SchemaError(f"{path}: expected an array, got {_tname(v)}")
    try:
        wire = _nd_to_wire(v)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from None
    if v.size > LIMITS["max_array_elems"]:
        raise SchemaError(f"{path}: array of {v.size} elements exceeds limit {LIMITS['max_array_elems']}")
    return wire


def _nd_dec(path: str, v: Any) -> np.ndarray:
    if not isinstance(v, dict) or "__nd__" not in v:
        raise SchemaError(f"{path}: expected an array, got {_tname(v)}")
    return _nd_from_wire(path, v)


def _list(item_t: Any):
    item_dec, item_enc = _compile(item_t)

    def dec(path, v):
        if type(v) is not list:
            raise SchemaError(f"{path}: expected a list, got {_tname(v)}")
        if len(v) > _MAX_ITEMS:
            _check_size(path, v)
        return [item_dec(f"{path}[{i}]", x) for i, x in enumerate(v)]

    def enc(path, v):
        if not isinstance(v, (list, tuple)):
            raise SchemaError(f"{path}: expected a list, got {_tname(v)}")
        if len(v) > _MAX_ITEMS:
            _check_size(path, list(v))
        return [item_enc(f"{path}[{i}]", x) for i, x in enumerate(v)]
    return dec, enc


def _dict(val_t: Any):
    val_dec, val_enc = _compile(val_t)
    passthrough = val_t is Any

    def walk(conv, path, v):
        if not isinstance(v, dict):
            raise SchemaError(f"{path}: expected a map, got {_tname(v)}")
        if len(v) > _MAX_ITEMS:
            _check_size(path, v)
        for k in v:
            if type(k) is not str:
                raise SchemaError(f"{path}: map key {k!r} is not a string")
        if passthrough:
            for k, x in v.items():
                _check_size(f"{path}.{k}", x)
            return v
        return {k: conv(f"{path}.{k}", x) for k, x in v.items()}

    return (lambda path, v: walk(val_dec, path, v)), (lambda path, v: walk(val_enc, path, v))


def _union(typ: Any):
    options = [_compile(o) for o in typing.get_args(typ)]

    def attempt(which, path, v):
        for pair in options:
            try:
                return pair[which](path, v)
            except SchemaError:
                continue
        raise SchemaError(f"{path}: {v!r} matches none of {typ}")

    return (lambda path, v: attempt(0, path, v)), (lambda path, v: attempt(1, path, v))


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[tuple[str, Any, Any], ...]:
    """(name, dec, enc) for every field of a message dataclass."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, *_compile(hints[f.name])) for f in dataclasses.fields(cls))


@functools.lru_cache(maxsize=None)
def _required(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)


def _dataclass(cls: type):
    def dec(path, v):
        if type(v) is not dict:
            raise SchemaError(f"{path}: expected {cls.__name__} map, got {_tname(v)}")
        return _build(cls, v, path)

    def enc(path, v):
        if not isinstance(v, cls):
            raise SchemaError(f"{path}: expected {cls.__name__}, got {_tname(v)}")
        return _to_wire(cls, v, path)
    return dec, enc


@functools.lru_cache(maxsize=None)
def _compile(typ: Any):
    if typ is Any:
        return _any_dec, _any_dec
    if typ is np.ndarray:
        return _nd_dec, _nd_enc
    if dataclasses.is_dataclass(typ):
        return _dataclass(typ)
    origin = typing.get_origin(typ)
    if origin in (list, tuple):
        return _list((typing.get_args(typ)[:1] or (Any,))[0])
    if origin is dict:
        return _dict((typing.get_args(typ) or (Any, Any))[1])
    if origin in (typing.Union, types.UnionType):
        return _union(typ)
    if typ is type(None):
        return _none_dec, _none_dec
    pair = _scalar(typ) if isinstance(typ, type) else None
    if pair is None:
        def unsupported(path, v):
            raise SchemaError(f"{path}: unsupported annotation {typ!r}")
        return unsupported, unsupported
    return pair


def _build(cls: type, data: dict, path: str) -> Any:
    missing = _required(cls) - data.keys()
    if missing:
        raise SchemaError(f"{path}: missing required field(s) {sorted(missing)}")
    kwargs = {}
    for name, dec, _ in _fields(cls):
        if name in data:  # unknown fields are tolerated and dropped
            kwargs[name] = dec(f"{path}.{name}", data[name])
    return cls(**kwargs)


def _to_wire(cls: type, obj: Any, path: str) -> dict:
    return {name: enc(f"{path}.{name}", getattr(obj, name)) for name, _, enc in _fields(cls)}


def _validate_outgoing(msg: Any) -> None:
    kind = getattr(type(msg), "KIND", None)
    if kind not in MESSAGE_TYPES or not isinstance(msg, MESSAGE_TYPES[kind]):
        raise SchemaError(f"cannot encode {type(msg).__name__}: not a registered message type")


def encode(msg: Any) -> bytes:
    """Serialize a message dataclass, checking every field by the same rules as decode."""
    _validate_outgoing(msg)
    # "r": the oldest reader version that understands this record (changes that only add fields keep it)
    body = {"k": msg.KIND, "v": msg.VERSION, "r": getattr(msg, "MIN_READER", 1), "d": _to_wire(type(msg), msg, msg.KIND)}
    try:
        return msgpack.packb(body, default=_default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SchemaError(f"{msg.KIND}: {exc}") from None


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
    # A newer writer that only added fields says so with "r" (the oldest reader that understands it); one
    # that does not say is read only by readers of its own version or newer: a record from the future whose
    # meaning may have changed is dead-lettered, never half-understood.
    reader = body.get("r", version)
    if not isinstance(reader, int) or reader < 1:
        raise SchemaError(f"{kind}: bad reader version {reader!r}")
    if reader > cls.VERSION:
        raise SchemaError(f"{kind}: schema version {version} (readable from version {reader}) is newer than this "
                          f"kernelrl reads ({cls.VERSION}): upgrade this consumer")
    if expected is not None and cls is not expected:
        raise SchemaError(f"expected {expected.KIND}, got {kind}")
    if not isinstance(fields, dict):
        raise SchemaError(f"{kind}: body must be a map")
    return _build(cls, fields, kind)
