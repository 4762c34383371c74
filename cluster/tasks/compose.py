"""Programmatic composition: stack 1-5 seed operators into one task, inferring shapes on the meta device.

Each step builds the candidate operator on ``torch.device("meta")`` and runs it on a
meta tensor of the running shape, so the next operator's arguments (in_channels,
in_features, ...) come from the true output shape without allocating memory. The
structure (which operators, their discrete options) and the sizes use separate random
streams, so the same seed gives a CPU-sized and a GPU-sized twin of one task.
"""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

from cluster.tasks.ops import MAX_NUMEL, MIN_NUMEL, Ctx, Op, Seed, fresh_input_shape

log = logging.getLogger(__name__)

# How likely each kind of seed is to be picked after the first operator.
_NEXT_KIND_WEIGHTS = {"unary": 0.6, "reduce": 0.12, "shaping": 0.28}
_FIRST_SHAPING = 0.85  # multi-op tasks usually start with a GEMM/conv-like operator, as in KernelBench level 2
_FIRST_COMPUTE = 0.75  # ... and most of those with a compute-heavy one (weights below), the rest any shaping op
_COMPUTE_WEIGHTS = {"Conv1d": 1.0, "Conv2d": 2.0, "Conv3d": 1.5, "ConvTranspose1d": 0.7, "ConvTranspose2d": 1.5,
                    "ConvTranspose3d": 1.2, "Linear": 2.5, "Matmul": 1.5, "BatchedMatmul": 1.0, "LlamaMLP": 0.5,
                    "GPT2Conv1D": 0.4, "MultiheadAttention": 0.4, "TransformerEncoderLayer": 0.4, "GRU": 0.25,
                    "LSTM": 0.25}


class ShapeError(ValueError):
    """An operator does not accept the running shape."""

    retriable = False


@dataclass
class Composition:
    ops: list[Op]
    input_shapes: list[tuple[int, ...]]
    shapes: list[tuple[int, ...]]  # output shape after each op
    backend: str
    seed: int
    flavour: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return "_".join(op.name for op in self.ops)


def _namespace(op: Op) -> dict:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    ns = {"torch": torch, "nn": nn, "F": F}
    for line in op.imports:
        exec(line, ns)  # noqa: S102 - our own import lines from the seed catalog
    return ns


def _fill(template: str, op: Op, **names) -> str:
    values = {k: repr(v) for k, v in op.params.items()}
    values.update(names)
    return template.format(**values)


def build_module(op: Op):
    """The op's module (or None for stateless ops), on the current default device."""
    if not op.ctor:
        return None
    return eval(_fill(op.ctor, op), _namespace(op))  # noqa: S307 - seed-catalog templates, not user input


def apply_op(op: Op, module, x, extras=()):
    ns = _namespace(op)
    ns.update({"_x": x, "_m": module})
    names = {"x": "_x", "m": "_m"}
    for i, e in enumerate(extras, 1):
        ns[f"_in{i}"] = e
        names[f"in{i}"] = f"_in{i}"
    return eval(_fill(op.call, op, **names), ns)  # noqa: S307


def infer_shape(op: Op, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of op on an input of `shape`, computed on the meta device."""
    import torch

    try:
        with torch.device("meta"):
            module = build_module(op)
            x = torch.empty(*shape)
            extras = [torch.empty(*s) for s in op.extra_inputs]
            y = apply_op(op, module, x, extras)
    except Exception as exc:  # noqa: BLE001 - any failure means the op does not fit this shape
        raise ShapeError(f"{op.name} on {shape}: {type(exc).__name__}: {exc}") from None
    if not isinstance(y, torch.Tensor):
        raise ShapeError(f"{op.name} on {shape}: returned {type(y).__name__}, not a tensor")
    return tuple(y.shape)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _pick(ctx: Ctx, seeds: list[Seed], weights_by_kind: dict[str, float]) -> Seed:
    weights = [weights_by_kind.get(s.kind, 0.0) / max(1, sum(1 for t in seeds if t.kind == s.kind)) for s in seeds]
    r = ctx.srng.random() * sum(weights)
    for s, w in zip(seeds, weights):
        r -= w
        if r <= 0:
            return s
    return seeds[-1]


def _first(ctx: Ctx, n_ops: int, seeds: list[Seed]) -> tuple[Op, tuple[int, ...], str] | None:
    r = ctx.srng.random()
    compute = [s for s in seeds if s.name in _COMPUTE_WEIGHTS]
    if n_ops > 1 and r < _FIRST_SHAPING * _FIRST_COMPUTE and compute:
        seed = ctx.srng.choices(compute, [_COMPUTE_WEIGHTS[s.name] for s in compute])[0]
    elif n_ops > 1 and r < _FIRST_SHAPING:
        seed = ctx.choice([s for s in seeds if s.kind in ("shaping", "head") and s.name not in ("Flatten", "Upsample")])
    else:
        seed = ctx.choice(list(seeds))
    rank = ctx.choice(seed.ranks)
    shape = fresh_input_shape(rank, ctx, seed.flavour)
    op = seed.make(shape, ctx)
    if op is None:
        return None
    if seed.kind == "head":
        shape = op.head_shape
    return op, shape, seed.flavour


def compose(n_ops: int, backend: str, seed: int, seeds: tuple[Seed, ...] | None = None,
            max_tries: int = 40) -> Composition | None:
    """A chain of n_ops operators with inferred shapes, or None if none was found in max_tries."""
    from cluster.tasks.seeds import catalog

    if not 1 <= n_ops <= 5:
        raise ValueError(f"n_ops must be 1..5, got {n_ops}")
    seeds = list(seeds or catalog())
    ctx = Ctx(backend=backend, srng=random.Random(f"s{seed}"), zrng=random.Random(f"z{seed}"))
    for _ in range(max_tries):
        first = _first(ctx, n_ops, seeds)
        if first is None:
            continue
        op, in_shape, flavour = first
        try:
            shape = infer_shape(op, in_shape)
        except ShapeError:
            continue
        ops, shapes = [op], [shape]
        while len(ops) < n_ops:
            nxt = _next(ctx, shape, seeds, ops)
            if nxt is None:
                break
            op, shape = nxt
            ops.append(op)
            shapes.append(shape)
        if len(ops) == n_ops and MIN_NUMEL[backend] <= _numel(shape):
            inputs = [in_shape] + [tuple(s) for s in ops[0].extra_inputs]
            return Composition(ops=ops, input_shapes=inputs, shapes=shapes, backend=backend, seed=seed,
                               flavour=flavour)
    return None


def _next(ctx: Ctx, shape, seeds: list[Seed], ops: list[Op]) -> tuple[Op, tuple[int, ...]] | None:
    pool = [s for s in seeds if s.kind != "head" and len(shape) in s.ranks]
    if ops[-1].source == "torch" and ops[-1].call.startswith("torch.") and "keepdim" in ops[-1].call:
        pool = [s for s in pool if s.kind == "unary"]  # after a reduction: elementwise epilogues only
    for _ in range(12):
        if not pool:
            return None
        seed = _pick(ctx, pool, _NEXT_KIND_WEIGHTS)
        op = seed.make(shape, ctx)
        if op is None or any(o.name == op.name for o in ops[-1:]):
            continue
        try:
            out = infer_shape(op, shape)
        except ShapeError:
            continue
        if MIN_NUMEL[ctx.backend] <= _numel(out) <= MAX_NUMEL[ctx.backend]:
            return op, out
    return None


def estimate_flops_bytes(comp: Composition) -> tuple[int, int]:
    """(FLOPs, bytes moved) of one forward, counted on the meta device (fp32)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    flops, nbytes = 0, 0
    shape = comp.input_shapes[0]
    with torch.device("meta"):
        for i, op in enumerate(comp.ops):
            module = build_module(op)
            x = torch.empty(*shape)
            extras = [torch.empty(*s) for s in op.extra_inputs] if i == 0 else []
            with FlopCounterMode(display=False) as counter:
                y = apply_op(op, module, x, extras)
            flops += counter.get_total_flops()
            params = sum(p.numel() for p in module.parameters()) if hasattr(module, "parameters") else 0
            nbytes += 4 * (x.numel() + y.numel() + params + sum(e.numel() for e in extras))
            shape = tuple(y.shape)
    return int(flops), int(nbytes)


def estimate_gpu_ms(comp: Composition, tflops: float = 30.0, tbps: float = 3.0, launch_us: float = 5.0) -> float:
    """A roofline guess of the eager H200-class runtime (fp32), for sizing before a GPU measures it."""
    flops, nbytes = estimate_flops_bytes(comp)
    return 1e3 * (flops / (tflops * 1e12) + nbytes / (tbps * 1e12)) + launch_us * 1e-3 * len(comp.ops)
