"""On CPU the reward pays for the judged time plus what the protocol leaves compressible: the judge's input copy
and one pass over the outputs, as its probe timed them before the candidate's code existed
(`sandbox.cpu_charge_compressible`, docs/sandbox.md "What stays compressible"). A candidate can take up to that
off its round trip (its work overlapping the judge's copy, its outputs written in place), so no claim, forged or
not, buys a speed tier the judge cannot prove. Real CPU evaluations in the OS sandbox."""
from __future__ import annotations

import sys
from pathlib import Path

from cluster.tasks.metrics import TaskResult, fast_p
from sandbox_workers.reward import milestone_reward, speedup
from tests.sandbox import redteam_cases as rc
from tests.sandbox.conftest import evaluate_isolated
from tests.sandbox.helpers import ROOT, shrunk_task

GEMM_EXAMPLE = ROOT / "skills" / "examples" / "cpu_12_Gemm_Multiply_LeakyReLU"


def forged_clock_in_place() -> dict[str, str]:
    """The held-out attack: ReLU written straight into the judge's output region, claims' clock at 1/100."""
    return {"model_new.py": rc._ARENA_DIRECT_PY, "kernels/relu.cpp": rc.cpp(rc.SERIAL)["kernels/relu.cpp"]}


def _evaluate(tmp_path, task: str, files: dict[str, str]) -> dict:
    return evaluate_isolated(str(tmp_path / "cache"), task, files, "both")


def test_a_forged_clock_with_outputs_in_place_gets_no_speed_tier_on_a_single_pass_task(tmp_path):
    # the CPU example's ReLU shape (16 MB in, 16 MB out); the kernel writes straight into the judge's output region
    # (the protocol's output copy skipped) and the claims' clock runs at 1/100: without the charge the CLI paid
    # this 3 in 3 of 3 runs, with it 1 in 3 of 3 (docs/sandbox/compressible/ab.out)
    rel, consts = rc.TASKS["relu_wide"]
    task = shrunk_task(rel, **consts)
    res = _evaluate(tmp_path, task, forged_clock_in_place())
    ev, tm = res["evidence"], res["timings"]
    why = (rc.describe(res), ev, tm)
    te, tc = tm["eager"]["median_s"], tm["compile"]["median_s"]
    assert res["correct"], why
    assert milestone_reward(True, True, tm["candidate"]["median_s"], te, tc) == 3.0, why  # the claim: forged
    # the reward is the tier of the charged time, and the charge (the judge's copies of one call) is about the faster
    # reference's whole call: a single-pass kernel, so no claim here buys the top tier (on a quiet host the charge
    # exceeds it; CI's loaded host once timed eager's ReLU at 7.27 ms against a 5.98 ms charge, reward 1)
    assert ev["reward_time_s"] >= ev["compressible_s"] > 0.5 * min(te, tc), why
    assert res["reward"] == milestone_reward(True, True, ev["reward_time_s"], te, tc), why
    assert res["reward"] < 3.0, why
    # where the two references agree (within 1.5x) the eager tier is lost as well; CI's loaded host once measured
    # eager's ReLU far above compile's, and the charged time then beat eager alone (reward 2)
    if max(te, tc) < 1.5 * min(te, tc):
        assert res["reward"] <= 1.0, why
    # the speed-ups reported are the paid time's, so `kernelrl eval`'s fast_p does not read the forged claim either
    # (below 1 vs compile on a quiet host; CI's loaded host once timed compile's ReLU at 14.6 ms with a stdev of 23 ms,
    # and the charged 12.3 ms read 1.19x: the claim's own speed-up is what must never be reported)
    assert res["speedup_vs_compile"] == speedup(ev["reward_time_s"], tc) < ev["measured_speedup_vs_compile"], why
    assert res["speedup_vs_eager"] == speedup(ev["reward_time_s"], te) < ev["measured_speedup_vs_eager"], why
    fast_1 = fast_p([TaskResult.from_eval("relu", "relu", 1, "cpu", res)], 1.0, "compile")
    assert fast_1 == (1.0 if res["speedup_vs_compile"] > 1.0 else 0.0), why


def test_a_compute_bound_task_keeps_most_of_its_speed_measurable(tmp_path):
    # the CPU example's GEMM (128 x 1024 x 1024) with its own solution: its inputs and outputs are small against
    # its work, so a speed-up of more than 2x stays payable (0.23 of the reference here, docs/sandbox.md)
    task = (GEMM_EXAMPLE / "model.py").read_text()
    files = {str(p.relative_to(GEMM_EXAMPLE)): p.read_text() for p in GEMM_EXAMPLE.rglob("*")
             if p.is_file() and p.name != "model.py"}
    res = _evaluate(tmp_path, task, files)
    assert res["correct"], rc.describe(res)
    ev, eager = res["evidence"], res["timings"]["eager"]["median_s"]
    assert 0 < ev["compressible_s"] < 0.5 * eager, (ev["compressible_s"], eager)


def test_the_charge_is_the_probes_copies_per_call():
    from sandbox_workers.evaluator import compressible_per_call

    probe = {"run_gap_min_s": 0.014, "snapshot_s": 0.006, "copy_in_s": 0.004, "batch": 2, "trials": 7}
    assert abs(compressible_per_call({"trusted": {"probe": probe}}) - 0.005) < 1e-12
    assert compressible_per_call({"trusted": {}}) == 0.0  # no probe (a candidate's session always has one)


if __name__ == "__main__":  # writes the attack's solution folder for the CLI (docs/sandbox/compressible/ab.sh)
    out = Path(sys.argv[1])
    for name, text in forged_clock_in_place().items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
