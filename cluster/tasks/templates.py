"""Templated seed operators: the ones whose arguments must be derived from the input shape.

Each factory reads the running tensor's shape (and the profile's sizes) and returns an
``Op`` or None when the shape does not suit it. Classes missing from the installed
torch/transformers are skipped, so the catalog follows the installation.
"""
from __future__ import annotations

from cluster.tasks.ops import Ctx, Op, Seed


def _divisor(n: int, options=(8, 4, 2)) -> int:
    return next((g for g in options if n % g == 0 and g < n), 1)


def _spatial_ok(shape, need: int) -> bool:
    return all(d >= need for d in shape[2:])


def _conv(dim: int, transpose: bool):
    name = f"ConvTranspose{dim}d" if transpose else f"Conv{dim}d"

    def factory(shape, ctx: Ctx):
        k = ctx.choice((3, 3, 4) if transpose else (3, 3, 5))
        stride = ctx.choice((1, 2)) if transpose else 1
        padding = ctx.choice((0, 1))
        out_c = ctx.size("channels") * ctx.choice((1, 2))
        if dim == 3:
            k = 3
        if not transpose and not _spatial_ok(shape, k):
            return None
        params = {"in_channels": shape[1], "out_channels": out_c, "kernel_size": k}
        extra = ""
        if stride != 1:
            params["stride"] = stride
            extra += ", stride={stride}"
        if padding:
            params["padding"] = padding
            extra += ", padding={padding}"
        return Op(name=name, source="torch.nn", call="{m}({x})", attr="conv_transpose" if transpose else "conv",
                  ctor=f"nn.{name}({{in_channels}}, {{out_channels}}, {{kernel_size}}{extra})", params=params)
    return Seed(name=name, source="torch.nn", ranks=(dim + 2,), factory=factory, kind="shaping")


def _norm(name: str, ranks, arg_of_shape, extra_ctor: str = "", attr: str = "norm", min_spatial: int = 1):
    def factory(shape, ctx: Ctx):
        if not _spatial_ok(shape, min_spatial) or (len(shape) == 2 and min_spatial > 1):
            return None
        params = arg_of_shape(shape)
        if params is None:
            return None
        args = ", ".join("{%s}" % k for k in params)
        return Op(name=name, source="torch.nn", call="{m}({x})", attr=attr, params=params,
                  ctor=f"nn.{name}({args}{extra_ctor})")
    return Seed(name=name, source="torch.nn", ranks=ranks, factory=factory)


def _pool(name: str, dim: int):
    def factory(shape, ctx: Ctx):
        if not _spatial_ok(shape, 4):
            return None
        k = ctx.choice((2, 2, 3))
        return Op(name=name, source="torch.nn", call="{m}({x})", attr="pool", params={"pool_kernel_size": k},
                  ctor=f"nn.{name}(kernel_size={{pool_kernel_size}})")
    return Seed(name=name, source="torch.nn", ranks=(dim + 2,), factory=factory, kind="shaping")


def _adaptive(name: str, dim: int):
    def factory(shape, ctx: Ctx):
        size = ctx.choice((1, 2, 4))
        if not _spatial_ok(shape, size * 2):
            return None
        return Op(name=name, source="torch.nn", call="{m}({x})", attr="pool", params={"output_size": size},
                  ctor=f"nn.{name}({{output_size}})")
    return Seed(name=name, source="torch.nn", ranks=(dim + 2,), factory=factory, kind="shaping")


def _simple(name: str, ranks, ctor: str, params=None, kind: str = "shaping", attr: str = ""):
    def factory(shape, ctx: Ctx):
        p = params(shape, ctx) if callable(params) else dict(params or {})
        if p is None:
            return None
        return Op(name=name, source="torch.nn", call="{m}({x})", attr=attr or name.lower(), params=p, ctor=ctor)
    return Seed(name=name, source="torch.nn", ranks=ranks, factory=factory, kind=kind)


def _linear(shape, ctx: Ctx):
    out = ctx.size("hidden" if len(shape) == 3 else "features")
    return Op(name="Linear" if len(shape) == 3 else "Gemm", source="torch.nn", call="{m}({x})", attr="linear",
              params={"in_features": shape[-1], "out_features": out}, ctor="nn.Linear({in_features}, {out_features})")


def _seq_module(name: str):
    def factory(shape, ctx: Ctx):
        e = shape[-1]
        heads = _divisor(e, (8, 4, 2))
        if name == "MultiheadAttention":
            return Op(name=name, source="torch.nn", call="{m}({x}, {x}, {x}, need_weights=False)[0]", attr="attn",
                      params={"embed_dim": e, "num_heads": heads},
                      ctor="nn.MultiheadAttention({embed_dim}, {num_heads}, batch_first=True)")
        if name == "TransformerEncoderLayer":
            return Op(name=name, source="torch.nn", call="{m}({x})", attr="encoder_layer",
                      params={"d_model": e, "nhead": heads, "dim_feedforward": 2 * e},
                      ctor="nn.TransformerEncoderLayer({d_model}, {nhead}, dim_feedforward={dim_feedforward}, "
                           "dropout=0.0, batch_first=True)")
        hidden = ctx.size("hidden")
        return Op(name=name, source="torch.nn", call="{m}({x})[0]", attr=name.lower(),
                  params={"input_size": e, "hidden_size": hidden},
                  ctor=f"nn.{name}({{input_size}}, {{hidden_size}}, batch_first=True)")
    return Seed(name=name, source="torch.nn", ranks=(3,), factory=factory, kind="shaping", flavour="sequence")


def _reduce(name: str, fn: str):
    def factory(shape, ctx: Ctx):
        dim = ctx.choice((1, -1)) if len(shape) > 2 else 1
        if shape[dim] < 2:
            return None
        return Op(name=name, source="torch", call=f"{fn}({{x}}, dim={{reduce_dim}}, keepdim=True)",
                  params={"reduce_dim": dim})
    return Seed(name=name, source="torch", ranks=(2, 3, 4, 5), factory=factory, kind="reduce")


def _scalar(name: str, expr: str, pname: str, values):
    def factory(shape, ctx: Ctx):
        return Op(name=name, source="torch", call=expr, params={pname: ctx.choice(values)})
    return Seed(name=name, source="torch", ranks=(2, 3, 4, 5), factory=factory)


def _clamp(shape, ctx: Ctx):
    lo, hi = ctx.choice(((-1.0, 1.0), (0.0, 6.0), (-0.5, 0.5), (-2.0, 2.0)))
    return Op(name="Clamp", source="torch", call="torch.clamp({x}, min={clamp_min}, max={clamp_max})",
              params={"clamp_min": lo, "clamp_max": hi})


def _param_op(name: str, expr: str):
    def factory(shape, ctx: Ctx):
        bias_shape = (shape[1],) + (1,) * (len(shape) - 2) if len(shape) > 2 else (shape[1],)
        return Op(name=name, source="torch", call=expr, attr="bias" if "Bias" in name else "scale",
                  params={"bias_shape" if "Bias" in name else "scale_shape": bias_shape},
                  ctor="nn.Parameter(torch.randn({%s}) * 0.02)" % ("bias_shape" if "Bias" in name else "scale_shape"))
    return Seed(name=name, source="torch", ranks=(2, 3, 4, 5), factory=factory)


def _matmul_head(shape, ctx: Ctx):
    m, k, n = ctx.size("matrix"), ctx.size("matrix"), ctx.size("matrix")
    return Op(name="Matmul", source="torch", call="torch.matmul({x}, {in1})", extra_inputs=((k, n),),
              head_shape=(m, k), dim_names=(("M", "K"), ("K", "N")))


def _bmm_head(shape, ctx: Ctx):
    b, m, k, n = ctx.size("batch"), ctx.size("hidden"), ctx.size("hidden"), ctx.size("hidden")
    return Op(name="BatchedMatmul", source="torch", call="torch.bmm({x}, {in1})", extra_inputs=((b, k, n),),
              head_shape=(b, m, k), dim_names=(("batch_size", "m", "k"), ("batch_size", "k", "n")))


def torch_templates() -> list[Seed]:
    import torch.nn as nn

    seeds: list[Seed] = [Seed("Linear", "torch.nn", (2, 3), _linear, kind="shaping")]
    for dim in (1, 2, 3):
        seeds += [_conv(dim, False), _conv(dim, True)]
        seeds.append(_norm(f"BatchNorm{dim}d", (dim + 1, dim + 2) if dim == 1 else (dim + 2,),
                           lambda s: {"num_features": s[1]}, attr="bn"))
        seeds.append(_norm(f"InstanceNorm{dim}d", (dim + 2,), lambda s: {"num_features": s[1]},
                           extra_ctor=", affine=True", attr="instance_norm", min_spatial=2))
        seeds += [_pool(f"MaxPool{dim}d", dim), _pool(f"AvgPool{dim}d", dim), _adaptive(f"AdaptiveAvgPool{dim}d", dim),
                  _adaptive(f"AdaptiveMaxPool{dim}d", dim)]
    seeds.append(_norm("GroupNorm", (3, 4, 5), lambda s: ({"num_groups": _divisor(s[1]), "num_channels": s[1]}
                                                         if _divisor(s[1]) > 1 else None), attr="group_norm"))
    seeds.append(_norm("LayerNorm", (2, 3), lambda s: {"normalized_shape": s[-1]}, attr="layer_norm"))
    seeds.append(_norm("RMSNorm", (2, 3), lambda s: {"normalized_shape": s[-1]}, attr="rms_norm"))
    seeds.append(_simple("LocalResponseNorm", (3, 4, 5), "nn.LocalResponseNorm({lrn_size})",
                         lambda s, c: {"lrn_size": c.choice((3, 5))}, kind="unary", attr="lrn"))
    seeds.append(_simple("LPPool2d", (4,), "nn.LPPool2d({norm_type}, {lp_kernel_size})",
                         lambda s, c: {"norm_type": 2, "lp_kernel_size": 2} if _spatial_ok(s, 4) else None))
    seeds.append(_simple("PixelShuffle", (4,), "nn.PixelShuffle({upscale_factor})",
                         lambda s, c: {"upscale_factor": 2} if s[1] % 4 == 0 else None))
    seeds.append(_simple("Upsample", (3, 4, 5), "nn.Upsample(scale_factor={scale_factor}, mode='nearest')",
                         {"scale_factor": 2}))
    seeds.append(_simple("Flatten", (3, 4, 5), "nn.Flatten()", {}))
    seeds.append(_simple("ReflectionPad2d", (4,), "nn.ReflectionPad2d({pad})", {"pad": 1}, attr="pad"))
    seeds.append(_simple("ZeroPad2d", (4,), "nn.ZeroPad2d({pad})", {"pad": 1}, attr="pad"))
    seeds += [_seq_module(n) for n in ("MultiheadAttention", "TransformerEncoderLayer", "GRU", "LSTM")]
    seeds += [_reduce("Sum", "torch.sum"), _reduce("Mean", "torch.mean"), _reduce("Max", "torch.amax"),
              _reduce("Min", "torch.amin"), _reduce("LogSumExp", "torch.logsumexp")]
    seeds += [_scalar("Scaling", "{x} * {scaling_factor}", "scaling_factor", (0.5, 1.5, 2.0)),
              _scalar("Divide", "{x} / {divisor}", "divisor", (2.0, 3.0, 4.0)),
              _scalar("AddConst", "{x} + {add_value}", "add_value", (0.5, 1.0, -0.25)),
              _scalar("Cumsum", "torch.cumsum({x}, dim={cumsum_dim})", "cumsum_dim", (1,)),
              Seed("Clamp", "torch", (2, 3, 4, 5), _clamp),
              Seed("Swish", "torch", (2, 3, 4, 5), lambda s, c: Op("Swish", "torch", "{x} * torch.sigmoid({x})")),
              _param_op("BiasAdd", "{x} + {m}"), _param_op("Multiply", "{x} * {m}")]
    seeds += [Seed("Matmul", "torch", (2,), _matmul_head, kind="head"),
              Seed("BatchedMatmul", "torch", (3,), _bmm_head, kind="head")]
    return [s for s in seeds if s.source != "torch.nn" or hasattr(nn, s.name) or s.name in ("Linear",)]


def transformers_templates() -> list[Seed]:
    try:
        import transformers.models.llama.modeling_llama
        import transformers.pytorch_utils  # noqa: F401
    except Exception:  # noqa: BLE001 - optional
        return []
    llama = "from transformers.models.llama.modeling_llama import {}"

    def rmsnorm(shape, ctx):
        return Op("LlamaRMSNorm", "transformers", "{m}({x})", ctor="LlamaRMSNorm({hidden_size})",
                  params={"hidden_size": shape[-1]}, imports=(llama.format("LlamaRMSNorm"),), attr="rms_norm")

    def mlp(shape, ctx):
        return Op("LlamaMLP", "transformers", "{m}({x})", attr="mlp",
                  ctor="LlamaMLP(LlamaConfig(hidden_size={hidden_size}, intermediate_size={intermediate_size}, "
                       "hidden_act='silu'))",
                  params={"hidden_size": shape[-1], "intermediate_size": 2 * shape[-1]},
                  imports=("from transformers import LlamaConfig", llama.format("LlamaMLP")))

    def conv1d(shape, ctx):
        return Op("GPT2Conv1D", "transformers", "{m}({x})", attr="conv1d", ctor="Conv1D({nf}, {nx})",
                  params={"nf": ctx.size("hidden"), "nx": shape[-1]},
                  imports=("from transformers.pytorch_utils import Conv1D",))
    return [Seed("LlamaRMSNorm", "transformers", (3,), rmsnorm, flavour="sequence"),
            Seed("LlamaMLP", "transformers", (3,), mlp, kind="shaping", flavour="sequence"),
            Seed("GPT2Conv1D", "transformers", (3,), conv1d, kind="shaping", flavour="sequence")]
