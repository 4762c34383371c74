"""Operator instances and size profiles: the building blocks that seeds produce and composition stacks.

An ``Op`` is one concrete operator with its constructor arguments fixed, written as
source-code templates so a composed task renders to a readable KernelBench-style file.
Placeholders: ``{x}`` the running tensor, ``{m}`` the op's module attribute
(``self.<attr>``), ``{NAME}`` an init argument (a module-level constant in the file;
``self.NAME`` inside ``forward``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable

# Sizes per profile; every tuple has the same length in each profile so a task's
# CPU-sized and GPU-sized twins draw the same index (and so the same structure).
PROFILES: dict[str, dict[str, tuple[int, ...]]] = {
    "cpu": {
        "batch": (8, 16, 16, 32),
        "features": (256, 512, 1024, 2048),
        "channels": (4, 8, 12, 16),
        "spatial2d": (16, 24, 32, 32),
        "spatial3d": (6, 8, 10, 12),
        "length": (128, 256, 384, 512),
        "seq": (16, 32, 48, 64),
        "hidden": (64, 96, 128, 192),
        "matrix": (128, 192, 256, 320),
    },
    "cuda": {
        "batch": (32, 64, 64, 128),
        "features": (2048, 4096, 4096, 8192),
        "channels": (32, 64, 64, 128),
        "spatial2d": (64, 96, 128, 128),
        "spatial3d": (16, 24, 32, 32),
        "length": (2048, 4096, 8192, 16384),
        "seq": (256, 512, 512, 1024),
        "hidden": (512, 768, 1024, 1024),
        "matrix": (1024, 2048, 3072, 4096),
    },
}
# Composition keeps intermediate tensors within these element counts.
MAX_NUMEL = {"cpu": 1 << 20, "cuda": 1 << 28}
MIN_NUMEL = {"cpu": 1 << 12, "cuda": 1 << 16}


def profile_for(backend: str) -> dict[str, tuple[int, ...]]:
    if backend not in PROFILES:
        raise ValueError(f"backend {backend!r} is not one of {sorted(PROFILES)}")
    return PROFILES[backend]


@dataclass
class Op:
    """One operator of a task, with its arguments fixed."""

    name: str  # short display name used in task names, e.g. "Conv2d", "GELU", "Sum"
    source: str  # torch.nn | torch.nn.functional | torch | transformers
    call: str  # forward expression, e.g. "{m}({x})", "F.gelu({x})", "torch.sum({x}, dim={dim}, keepdim=True)"
    ctor: str = ""  # module constructor expression ("" = stateless op)
    params: dict[str, Any] = field(default_factory=dict)  # init arguments by local name
    imports: tuple[str, ...] = ()  # extra import lines the task file needs
    extra_inputs: tuple[tuple[int, ...], ...] = ()  # further forward inputs (heads like matmul)
    attr: str = ""  # preferred attribute name for the module
    head_shape: tuple[int, ...] = ()  # heads only: the shape of the first input they create
    dim_names: tuple[tuple[str, ...], ...] = ()  # heads only: names of the dims of each input

    def describe(self) -> str:
        return f"{self.source}.{self.name}"


@dataclass
class Ctx:
    """Random choices for one composition: structure (srng) and sizes (zrng) kept apart."""

    backend: str
    srng: random.Random
    zrng: random.Random

    @property
    def prof(self) -> dict[str, tuple[int, ...]]:
        return PROFILES[self.backend]

    def size(self, key: str) -> int:
        values = self.prof[key]
        return values[self.zrng.randrange(len(values))]

    def choice(self, options):
        return options[self.srng.randrange(len(options))]


def fresh_input_shape(rank: int, ctx: Ctx, flavour: str = "") -> tuple[int, ...]:
    """A sensible input shape of the given rank for this profile."""
    b = ctx.size("batch")
    if rank == 2:
        return (b, ctx.size("features"))
    if rank == 3:
        if flavour == "sequence":
            return (b, ctx.size("seq"), ctx.size("hidden"))
        return (b, ctx.size("channels"), ctx.size("length"))
    if rank == 4:
        s = ctx.size("spatial2d")
        return (b, ctx.size("channels"), s, s)
    if rank == 5:
        s = ctx.size("spatial3d")
        return (b, ctx.size("channels"), s, s, s)
    raise ValueError(f"no input shape for rank {rank}")


# A seed: name, where it comes from, which input ranks it accepts, and a factory that
# turns (input shape, ctx) into an Op (or None when the shape does not suit it).
Factory = Callable[[tuple[int, ...], Ctx], "Op | None"]


@dataclass
class Seed:
    name: str
    source: str
    ranks: tuple[int, ...]
    factory: Factory
    kind: str = "unary"  # unary (shape-preserving) | shaping | head (takes its own inputs) | reduce
    flavour: str = ""  # "sequence" for [B, L, H] ops

    def make(self, shape: tuple[int, ...], ctx: Ctx) -> Op | None:
        if len(shape) not in self.ranks:
            return None
        return self.factory(shape, ctx)
