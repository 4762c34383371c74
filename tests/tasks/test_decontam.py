"""Decontamination by AST similarity against the KernelBench evaluation set."""
from __future__ import annotations

import re

import pytest

from cluster.tasks.compose import compose
from cluster.tasks.decontam import Decontaminator, ast_tokens, default_eval_dir, similarity
from cluster.tasks.render import render


@pytest.fixture(scope="module")
def kb():
    d = default_eval_dir()
    assert (d / "level1").is_dir() and (d / "level2").is_dir(), f"KernelBench tasks missing at {d}"
    return Decontaminator.from_dir(d, threshold=0.9)


def _near_copy(src: str) -> str:
    """What a careless generator produces: renamed identifiers, new sizes, no docstrings or comments."""
    src = re.sub(r'"""(.|\n)*?"""', "", src)
    src = re.sub(r"#.*", "", src)
    src = re.sub(r"\b(\d+)\b", lambda m: str(int(m.group(1)) + 3), src)
    for old, new in (("conv", "c1"), ("scaling_factor", "alpha"), ("bias", "b0"), ("x", "inp")):
        src = re.sub(rf"\b{old}\b", new, src)
    return src


def test_near_copy_is_dropped(kb):
    path = default_eval_dir() / "level2" / "1_Conv2D_ReLU_BiasAdd.py"
    copy = _near_copy(path.read_text())
    assert copy != path.read_text()
    dirty, match = kb.is_contaminated(copy)
    assert dirty and match.score > 0.95 and match.name.endswith("1_Conv2D_ReLU_BiasAdd.py")


def test_distinct_task_is_kept(kb):
    comp = compose(3, "cpu", seed=7)
    dirty, match = kb.is_contaminated(render(comp))
    assert not dirty and match.score < 0.9


def test_threshold_is_configurable(kb):
    comp = compose(3, "cpu", seed=7)
    score = kb.best(render(comp)).score
    strict = Decontaminator({"kb": (default_eval_dir() / "level2" / "1_Conv2D_ReLU_BiasAdd.py").read_text()},
                            threshold=max(0.01, score / 2))
    assert strict.is_contaminated(render(comp))[0]
    with pytest.raises(ValueError):
        Decontaminator({}, threshold=1.5)


def test_api_calls_weigh_more_than_plumbing():
    a = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.relu(x)\n"
    b = "import torch\nclass Model:\n    def forward(self, y):\n        return torch.relu(y)\n"
    c = "import torch\nclass Model:\n    def forward(self, x):\n        return torch.sigmoid(x)\n"
    assert similarity(ast_tokens(a), ast_tokens(b)) == 1.0
    assert similarity(ast_tokens(a), ast_tokens(c)) < 0.8
