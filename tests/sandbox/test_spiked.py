"""Spiked inputs: every call's inputs, checked and timed alike, carry a few elements far from the rest at secret
positions fresh per call, so a kernel that reduces a sample of its input is wrong while an honest one is not
(docs/sandbox.md "Spiked inputs"). Real CPU evaluations in the OS sandbox; the sampled MSE itself is the red team's
(test_redteam.py, heldout family)."""
from __future__ import annotations

import torch

from sandbox_workers.judge import SPIKE_EVERY, spike_plan, spiked
from tests.sandbox import redteam_cases as rc
from tests.sandbox.conftest import evaluate_isolated
from tests.sandbox.helpers import RELU_TASK, relu_solution, shrunk_task


def _verify(tmp_path, task: str, files: dict[str, str], **sandbox) -> dict:
    return evaluate_isolated(str(tmp_path / "cache"), task, files, "verify", **sandbox)


def test_only_real_valued_tensors_get_spikes_and_they_keep_the_sign():
    rand, randn, labels = torch.rand(64, 64), torch.randn(4096), torch.randint(0, 2, (64,)).float() * 2 - 1
    plan = spike_plan([rand, randn, labels, torch.ones(1), 3, -torch.rand(1024)])
    assert plan[0][1] == 1 and plan[1][1] == 0 and plan[5][1] == -1
    assert plan[2] is None and plan[3] is None and plan[4] is None  # labels keep their meaning; scalars, plain values
    a = spiked([rand, randn, labels, torch.ones(1), 3, -torch.rand(1024)], plan, seed=1)
    b = spiked([rand, randn, labels, torch.ones(1), 3, -torch.rand(1024)], plan, seed=2)
    moved = (a[0] != rand).sum().item()
    assert 1 <= moved <= rand.numel() // SPIKE_EVERY and float(a[0].min()) >= 0  # sign-definite stays so
    assert float((a[0] - rand).max()) > 10 * float(rand.abs().mean())
    assert not torch.equal(a[0], b[0])  # fresh positions per call
    assert torch.equal(a[2], labels) and a[4] == 3 and float(a[5].max()) <= 0
    assert torch.equal(rand, rand.clone())  # the task's own tensors are not written


def test_a_sampled_reduction_misses_them_and_the_honest_one_does_not():
    vals = [torch.rand(256, 4096) * 0.7, torch.rand(256, 4096)]
    plan = spike_plan(vals)
    missed = 0
    for seed in range(20):
        p, q = spiked(vals, plan, seed)
        ref = torch.mean((p - q) ** 2)
        sample = torch.mean((p.view(-1)[::64] - q.view(-1)[::64]) ** 2)
        missed += abs(float(sample - ref)) > 1e-2 + 1e-2 * abs(float(ref))
    assert missed >= 10  # ~82 % of calls; an evaluation checks at least 6
    plain = torch.mean((vals[0].view(-1)[::64] - vals[1].view(-1)[::64]) ** 2)
    assert abs(float(plain - torch.mean((vals[0] - vals[1]) ** 2))) < 1e-2  # without spikes the sample passed


def test_an_honest_kernel_passes_with_spikes_and_the_evidence_says_so(tmp_path):
    task = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
    res = _verify(tmp_path, task, relu_solution())
    assert res["correct"] and res["evidence"]["spiked_inputs"] == "on", rc.describe(res)
    off = _verify(tmp_path, task, relu_solution(), spiked_inputs=False)
    assert off["correct"] and off["evidence"]["spiked_inputs"] == "off (sandbox.spiked_inputs)", rc.describe(off)


def test_a_reference_not_finite_on_spiked_inputs_goes_without(tmp_path):
    # exp of values 32 magnitudes out overflows half precision: the task is checked on its own inputs only
    task = shrunk_task(RELU_TASK[0], **RELU_TASK[1]).replace("torch.relu(x)", "torch.exp(x * 4.0).half()")
    res = _verify(tmp_path, task, relu_solution())
    assert res["evidence"]["spiked_inputs"] == "off: the reference is not finite on spiked inputs", rc.describe(res)
