"""Seed operators crawled from torch.nn, torch.nn.functional, torch and transformers.

Modules and functions whose arguments all have defaults are crawled and probed
(run on small tensors of ranks 2-5, twice under different RNG seeds): the
deterministic, shape-preserving, non-identity ones become unary seeds. Operators
that need arguments (convolutions, norms, pools, linear layers, reductions, ...)
come from templates that derive those arguments from the input shape; a template
whose class is missing from the installed torch is skipped.
"""
from __future__ import annotations

import inspect
import logging
import warnings
from functools import lru_cache

from cluster.tasks.ops import Ctx, Op, Seed

log = logging.getLogger(__name__)

_PROBE_SHAPES = {2: (3, 10), 3: (2, 4, 10), 4: (2, 4, 6, 6), 5: (2, 4, 4, 4, 4)}
# Crawled names that are stochastic, in-place, deprecated aliases or not tensor->tensor.
_SKIP = {"Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
         "FeatureAlphaDropout", "RReLU", "Module", "Container", "Threshold", "MultiheadAttention",
         "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
         "rrelu", "sigmoid", "tanh", "threshold", "gumbel_softmax", "native_channel_shuffle",
         "channel_shuffle"}

# Whole torch.nn submodules that never hold unary seeds (losses take two inputs; the rest need arguments).
_SKIP_MODULES = {"loss", "transformer", "rnn", "container", "sparse", "linear", "conv", "batchnorm",
                 "instancenorm", "normalization", "pooling", "padding", "pixelshuffle", "upsampling",
                 "distance", "fold", "channelshuffle", "flatten", "dropout", "module"}


def _probe(fn, rank: int) -> bool:
    """True when fn is deterministic, shape-preserving and not the identity on a rank-`rank` tensor."""
    import torch

    x = torch.randn(*_PROBE_SHAPES[rank], generator=torch.Generator().manual_seed(rank))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(1)
            y1 = fn(x.clone())
            torch.manual_seed(2)
            y2 = fn(x.clone())
    except Exception:  # noqa: BLE001 - a probe failure only means "not a seed at this rank"
        return False
    if not (isinstance(y1, torch.Tensor) and isinstance(y2, torch.Tensor)):
        return False
    if y1.shape != x.shape or y1.dtype != x.dtype or not torch.equal(y1, y2):
        return False
    return not torch.allclose(y1, x)


def _crawl_ranks(fn) -> tuple[int, ...]:
    return tuple(r for r in (2, 3, 4, 5) if _probe(fn, r))


def _defaults_only(obj) -> dict | None:
    """Keyword arguments that make obj callable with one tensor, or None if it needs more."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    kwargs, positional = {}, 0
    for p in sig.parameters.values():
        if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name == "dim" and p.default is None:
            kwargs["dim"] = 1
        elif p.name == "inplace":
            continue
        elif p.default is p.empty:
            positional += 1
    return kwargs if positional <= 1 else None


def _unary_module_seed(name: str, source: str, ctor: str, ranks, imports=()) -> Seed:
    def factory(shape, ctx: Ctx, _c=ctor):
        return Op(name=name, source=source, call="{m}({x})", ctor=_c, imports=tuple(imports),
                  attr=name.lower())
    return Seed(name=name, source=source, ranks=ranks, factory=factory)


def _unary_function_seed(name: str, expr: str, source: str, ranks) -> Seed:
    def factory(shape, ctx: Ctx, _e=expr):
        return Op(name=name, source=source, call=_e)
    return Seed(name=name, source=source, ranks=ranks, factory=factory)


def crawl_nn_modules() -> list[Seed]:
    """torch.nn modules constructible without arguments and usable as x -> f(x)."""
    import torch.nn as nn

    seeds = []
    for name in sorted(dir(nn)):
        cls = getattr(nn, name)
        if name in _SKIP or not inspect.isclass(cls) or not issubclass(cls, nn.Module):
            continue
        if cls.__module__.rsplit(".", 1)[-1] in _SKIP_MODULES:
            continue
        kwargs = _defaults_only(cls)
        if kwargs is None or any(p for p in _required(cls)):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = cls(**kwargs)
        except Exception:  # noqa: BLE001 - not constructible without arguments
            continue
        if list(mod.parameters()) and name not in ("PReLU",):
            continue  # parameterised modules come from templates with shape-derived arguments
        ranks = _crawl_ranks(mod)
        if ranks:
            args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            seeds.append(_unary_module_seed(name, "torch.nn", f"nn.{name}({args})", ranks))
    return seeds


def _required(obj) -> list[str]:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ["?"]
    return [p.name for p in sig.parameters.values()
            if p.default is p.empty and p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def crawl_functional() -> list[Seed]:
    """torch.nn.functional functions callable as F.f(x[, dim=1]) that pass the probe."""
    import torch.nn.functional as F

    seeds = []
    for name in sorted(dir(F)):
        fn = getattr(F, name)
        if name.startswith("_") or name.endswith("_") or name in _SKIP or not callable(fn):
            continue
        if inspect.isclass(fn):
            continue
        kwargs = _defaults_only(fn)
        if kwargs is None:
            continue
        ranks = _crawl_ranks(lambda x, _f=fn, _k=kwargs: _f(x, **_k))
        if ranks:
            args = "".join(f", {k}={v!r}" for k, v in kwargs.items())
            seeds.append(_unary_function_seed(f"F_{name}", f"F.{name}({{x}}{args})", "torch.nn.functional", ranks))
    return seeds


def crawl_transformers() -> list[Seed]:
    """Activation modules of transformers (ACT2CLS) plus a few layers, when transformers is installed."""
    try:
        from transformers import activations
    except Exception:  # noqa: BLE001 - transformers is optional
        return []
    seeds = []
    for key, entry in sorted(activations.ACT2CLS.items()):
        cls, kwargs = entry if isinstance(entry, tuple) else (entry, {})
        if not inspect.isclass(cls) or cls.__module__ != activations.__name__:
            continue
        try:
            mod = cls(**kwargs)
        except Exception:  # noqa: BLE001 - needs arguments we cannot guess
            continue
        if list(mod.parameters()):
            continue
        ranks = _crawl_ranks(mod)
        if ranks:
            args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            name = cls.__name__ if not kwargs else f"{cls.__name__}_{key}"
            seeds.append(_unary_module_seed(name, "transformers", f"{cls.__name__}({args})", ranks,
                                            imports=(f"from transformers.activations import {cls.__name__}",)))
    from cluster.tasks.templates import transformers_templates

    return _dedupe(seeds) + transformers_templates()


def _dedupe(seeds: list[Seed]) -> list[Seed]:
    seen, out = set(), []
    for s in seeds:
        if s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return out


@lru_cache(maxsize=1)
def catalog() -> tuple[Seed, ...]:
    """Every seed operator available on this installation (crawled + templated), in a stable order."""
    from cluster.tasks.templates import torch_templates

    seeds = crawl_nn_modules() + crawl_functional() + torch_templates() + crawl_transformers()
    seeds = _dedupe(seeds)
    log.info("seed catalog: %d operators", len(seeds))
    return tuple(seeds)


def summary(seeds=None) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in seeds or catalog():
        out[s.source] = out.get(s.source, 0) + 1
    return out
