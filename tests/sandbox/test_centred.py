"""The centred check: one more checked call whose sign-definite floating inputs are shifted to mean zero, so an op
the task only ever feeds non-negative values (torch.rand) is also checked on its other branch, wherever the
reference stays finite there (docs/sandbox.md "the centred check"). Real CPU evaluations in the OS sandbox; the
identity 'ReLU' itself is the red team's (test_redteam.py, heldout family)."""
from __future__ import annotations

import torch

from sandbox_workers.judge import centred
from tests.sandbox import redteam_cases as rc
from tests.sandbox.conftest import evaluate_isolated
from tests.sandbox.helpers import RELU_TASK, relu_solution, relu_with_body, shrunk_task

SQRT_BODY = "  for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);"


def _verify(tmp_path, task: str, files: dict[str, str], **sandbox) -> dict:
    return evaluate_isolated(str(tmp_path / "cache"), task, files, "verify", **sandbox)


def test_only_sign_definite_real_valued_inputs_are_shifted():
    rand, randn = torch.rand(64, 32), torch.randn(64)
    labels = torch.randint(0, 2, (64,)).float() * 2 - 1  # +-1 targets: both signs, kept anyway
    mask = torch.randint(0, 2, (64,)).float()  # 0/1: sign-definite but integer-valued, so it keeps its meaning
    out, changed = centred([rand, randn, labels, mask, torch.ones(8), 7, -torch.rand(16)])
    assert changed
    assert abs(float(out[0].mean())) < 1e-5 and float(out[0].min()) < 0 < float(out[0].max())
    assert torch.allclose(out[0] + rand.mean(), rand)
    assert all(torch.equal(a, b) for a, b in zip(out[1:5], [randn, labels, mask, torch.ones(8)])) and out[5] == 7
    assert float(out[6].max()) > 0  # all <= 0 is sign-definite too
    assert centred([randn, labels, 3])[1] is False  # nothing to shift: no extra call


def test_an_honest_relu_passes_the_centred_call_and_the_identity_does_not(tmp_path):
    task = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
    res = _verify(tmp_path, task, relu_solution())
    assert res["correct"] and res["evidence"]["centred_check"] == "checked", rc.describe(res)
    bad = _verify(tmp_path, task, relu_with_body("  for (int64_t i = 0; i < n; ++i) y[i] = x[i];"))
    assert not bad["correct"] and bad["reward"] == -1.0 and bad["fault"] == "policy", rc.describe(bad)
    assert bad["error"].startswith("on the centred check's inputs"), rc.describe(bad)


def test_a_reference_not_finite_on_centred_inputs_skips_the_call(tmp_path):
    # sqrt of rand: NaN on negative values, so only the task's own domain is checked and an honest sqrt passes
    task = shrunk_task(RELU_TASK[0], **RELU_TASK[1]).replace("torch.relu(x)", "torch.sqrt(x)")
    res = _verify(tmp_path, task, relu_with_body(SQRT_BODY, includes="#include <cmath>"))
    assert res["correct"], rc.describe(res)
    assert res["evidence"]["centred_check"] == "skipped: the reference is not finite on centred inputs"
    # and the switch turns the call off altogether: the identity 'ReLU' passes again
    off = _verify(tmp_path, shrunk_task(RELU_TASK[0], **RELU_TASK[1]),
                  relu_with_body("  for (int64_t i = 0; i < n; ++i) y[i] = x[i];"), check_centred_inputs=False)
    assert off["correct"] and off["evidence"]["centred_check"] == "", rc.describe(off)
