"""Render a Composition as a KernelBench-style task file (Model, get_inputs, get_init_inputs)."""
from __future__ import annotations

from cluster.tasks.compose import Composition
from cluster.tasks.ops import Op

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def input_dim_names(comp: Composition) -> list[tuple[str, ...]]:
    first = comp.ops[0]
    if first.dim_names:
        return [tuple(n) for n in first.dim_names]
    shape = comp.input_shapes[0]
    rank = len(shape)
    if rank == 2:
        return [("batch_size", "in_features")]
    if rank == 3:
        if comp.flavour == "sequence":
            return [("batch_size", "seq_len", "hidden_size")]
        return [("batch_size", "in_channels", "length")]
    if rank == 4:
        return [("batch_size", "in_channels", "height", "width")]
    return [("batch_size", "in_channels", "depth", "height", "width")]


class _Names:
    """Module-level constants: a name is shared when its value matches, else suffixed."""

    def __init__(self):
        self.values: dict[str, object] = {}

    def bind(self, name: str, value) -> str:
        candidate, k = name, 1
        while candidate in self.values and self.values[candidate] != value:
            k += 1
            candidate = f"{name}_{k}"
        self.values.setdefault(candidate, value)
        return candidate


def _attr_name(op: Op, taken: set[str]) -> str:
    base = op.attr or op.name.lower()
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def render(comp: Composition) -> str:
    names = _Names()
    dims = input_dim_names(comp)
    input_exprs = []
    for shape, dim_names in zip(comp.input_shapes, dims):
        bound = [names.bind(n, v) for n, v in zip(dim_names, shape)]
        input_exprs.append(f"torch.randn({', '.join(bound)})")
    n_input_consts = len(names.values)

    init_args: list[str] = []
    init_lines: list[str] = []
    fwd_lines: list[str] = []
    imports: list[str] = []
    taken: set[str] = set()
    for i, op in enumerate(comp.ops):
        for line in op.imports:
            if line not in imports:
                imports.append(line)
        gnames = {k: names.bind(k, v) for k, v in op.params.items()}
        for g in gnames.values():
            if g not in init_args:
                init_args.append(g)
        fmt = {}
        if op.ctor:
            attr = _attr_name(op, taken)
            init_lines.append(f"self.{attr} = {op.ctor.format(**gnames)}")
            fmt["m"] = f"self.{attr}"
        else:
            for g in gnames.values():
                line = f"self.{g} = {g}"
                if line not in init_lines:
                    init_lines.append(line)
        call_names = {k: (g if op.ctor else f"self.{g}") for k, g in gnames.items()}
        extras = {f"in{j}": f"y{'' if j == 1 else j}" for j in range(1, len(op.extra_inputs) + 1)} if i == 0 else {}
        fwd_lines.append(f"x = {op.call.format(x='x', **fmt, **call_names, **extras)}")

    extra_params = [f"y{'' if j == 1 else j}" for j in range(1, len(comp.input_shapes))]
    fwd_sig = ", ".join(["self", "x", *extra_params])
    chain = " -> ".join(op.name for op in comp.ops)
    consts = [f"{k} = {v!r}" for k, v in names.values.items()]
    out = [HEADER + "".join(f"{line}\n" for line in imports), "",
           "class Model(nn.Module):",
           f'    """{chain}."""',
           "",
           f"    def __init__({', '.join(['self', *init_args])}):",
           "        super().__init__()"]
    out += [f"        {line}" for line in init_lines]
    out += ["", f"    def forward({fwd_sig}):"]
    out += [f"        {line}" for line in fwd_lines]
    out += ["        return x", "", ""]
    out += consts[:n_input_consts] + consts[n_input_consts:]
    out += ["", "",
            "def get_inputs():",
            f"    return [{', '.join(input_exprs)}]",
            "", "",
            "def get_init_inputs():",
            f"    return [{', '.join(init_args)}]",
            ""]
    return "\n".join(out)
