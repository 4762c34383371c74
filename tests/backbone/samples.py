"""Sample messages for the backbone tests: one of every registered type, built from its fields."""
from __future__ import annotations

import dataclasses
import typing

import numpy as np

from schemas import codec
from schemas.messages import MESSAGE_TYPES, RequestHeader, Trajectory, TurnInfo


def _value(typ, name: str, depth: int = 0):
    origin = typing.get_origin(typ)
    if typ is np.ndarray:
        return np.arange(7, dtype=np.int32)
    if dataclasses.is_dataclass(typ):
        return build(typ, depth + 1)
    if origin in (list, tuple):
        (item,) = typing.get_args(typ)[:1] or (str,)
        return [_value(item, name, depth + 1) for _ in range(2)]
    if origin is dict:
        val = (typing.get_args(typ) or (str, typing.Any))[1]
        if val is typing.Any:
            return {"a": 1, "b": [1.5, "x"], "nested": {"ok": True}}
        return {"k1": _value(val, name, depth + 1), "k2": _value(val, name, depth + 1)}
    if origin in (typing.Union, __import__("types").UnionType):
        return _value(typing.get_args(typ)[0], name, depth)
    return {str: f"{name}-v", int: 3, float: 2.5, bool: True, bytes: b"\x00\x01\xff" * 3}.get(typ, None)


def build(cls, depth: int = 0):
    """An instance of ``cls`` with every field set to a non-default value of its type."""
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _value(hints[f.name], f.name, depth) for f in dataclasses.fields(cls)}
    if cls is RequestHeader:
        kwargs.update(reply_topic="t.tool.replies", deadline_ms=0)
    if cls is Trajectory:
        n = 7
        kwargs.update(token_ids=np.arange(n, dtype=np.int32), logprobs=np.linspace(-1, 0, n, dtype=np.float32),
                      loss_mask=np.array([0, 0, 1, 1, 1, 0, 1], np.uint8),
                      policy_version=np.array([-1, -1, 3, 3, 3, -1, 4], np.int32),
                      turns=[TurnInfo(start=0, gen_start=2, gen_end=5, tool_name="compile")])
    return cls(**kwargs)


def all_samples() -> dict[str, object]:
    return {kind: build(cls) for kind, cls in MESSAGE_TYPES.items()}


def assert_same(a, b) -> None:
    """Field-by-field equality that understands numpy arrays and nested dataclasses."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name))
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b, (a, b)


def big_trajectory(tokens: int, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    return Trajectory(episode_id=f"ep-{seed}", task_id="task-big", actor_id="actor-0",
                      token_ids=rng.integers(0, 150000, tokens, dtype=np.int32),
                      logprobs=rng.standard_normal(tokens).astype(np.float32),
                      loss_mask=rng.integers(0, 2, tokens, dtype=np.uint8),
                      policy_version=rng.integers(-1, 9, tokens, dtype=np.int32),
                      turns=[TurnInfo(start=i * 100, gen_start=i * 100 + 10, gen_end=i * 100 + 90)
                             for i in range(tokens // 1000)], reward=1.0)


def roundtrip(msg):
    return codec.decode(codec.encode(msg), expected=type(msg))
