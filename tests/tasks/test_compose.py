"""Seed crawl and composition: runnable tasks of every length 1-5, shapes inferred on the meta device."""
from __future__ import annotations

import types

import pytest
import torch

from cluster.tasks.compose import compose, infer_shape
from cluster.tasks.render import render
from cluster.tasks.seeds import catalog, summary


def _load(source: str):
    mod = types.ModuleType("synth_task")
    exec(compile(source, "<synth>", "exec"), mod.__dict__)
    return mod


def test_catalog_is_crawled_from_torch_functional_and_transformers():
    counts = summary()
    names = {s.name for s in catalog()}
    assert counts["torch.nn"] >= 40 and counts["torch.nn.functional"] >= 10 and counts["torch"] >= 10
    assert counts.get("transformers", 0) >= 3  # transformers is installed in the venv
    # crawled (no-argument modules / functions) and templated (shape-derived arguments) seeds
    assert {"GELU", "Mish", "F_silu", "Conv2d", "ConvTranspose3d", "Linear", "GroupNorm", "LlamaRMSNorm"} <= names
    # stochastic and identity operators are never seeds
    assert not names & {"Dropout", "RReLU", "Identity", "F_dropout", "AlphaDropout"}


@pytest.mark.parametrize("n_ops", [1, 2, 3, 4, 5])
def test_composition_of_every_length_runs_with_the_inferred_shapes(n_ops):
    made = 0
    for k in range(3):
        comp = compose(n_ops, "cpu", seed=1000 * n_ops + k)
        assert comp is not None, f"no {n_ops}-op composition for seed {k}"
        assert len(comp.ops) == n_ops and len(comp.shapes) == n_ops
        mod = _load(render(comp))
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs())
        inputs = mod.get_inputs()
        assert [tuple(t.shape) for t in inputs] == comp.input_shapes
        with torch.no_grad():
            out = model(*inputs)
        assert tuple(out.shape) == comp.shapes[-1]
        assert out.dtype == torch.float32
        made += 1
    assert made == 3


def test_gpu_sized_twin_has_the_same_structure_and_bigger_inputs():
    for seed in range(6):
        cpu, gpu = compose(2, "cpu", seed), compose(2, "cuda", seed)
        if cpu is None or gpu is None:
            continue
        assert cpu.name == gpu.name
        assert [o.describe() for o in cpu.ops] == [o.describe() for o in gpu.ops]
        n = lambda s: int(torch.tensor(s).prod())  # noqa: E731
        assert n(gpu.input_shapes[0]) > 8 * n(cpu.input_shapes[0])
        # the GPU-sized file is valid: build it on the meta device only (no memory)
        mod = _load(render(gpu))
        with torch.device("meta"):
            model = mod.Model(*mod.get_init_inputs())
            out = model(*[torch.empty(*t.shape) for t in [torch.empty(*s, device="meta") for s in gpu.input_shapes]])
        assert tuple(out.shape) == gpu.shapes[-1]
        return
    pytest.fail("no twin pair among 6 seeds")


def test_shape_inference_rejects_an_operator_that_does_not_fit():
    from cluster.tasks.compose import ShapeError
    from cluster.tasks.ops import Op

    conv = Op(name="Conv2d", source="torch.nn", call="{m}({x})", ctor="nn.Conv2d({c}, 8, 3)", params={"c": 3})
    assert infer_shape(conv, (2, 3, 16, 16)) == (2, 8, 14, 14)
    with pytest.raises(ShapeError):
        infer_shape(conv, (2, 5, 16, 16))  # wrong channel count
