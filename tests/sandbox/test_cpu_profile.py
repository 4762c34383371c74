"""The worker's CPU profile of the candidate (sandbox_workers/cpu_profile.py): real perf samples, real evaluations.

The rule it enforces (no torch compute in ModelNew) is tried as a cheat would in test_redteam.py
(`*_then_torch_at_the_example_shape`); here: the attribution itself, honest solutions at the examples' shapes
staying clean, and failing closed (an infrastructure fault, never a reward) when the profile cannot be taken.
"""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox_workers import cpu_profile, cpu_sampler

ROOT = Path(__file__).resolve().parents[2]
# one thread (no OpenMP pool spinning in libgomp, the runtime, between products) and phases measured in the thread's
# CPU time, so a loaded host stretches them without changing what is sampled
CHILD = r"""
import sys, time, torch
torch.set_num_threads(1)
sys.stdin.readline()
a = torch.randn(384, 384)
marks, c = [time.monotonic_ns()], time.thread_time()
while time.thread_time() - c < 0.6:
    a @ a
marks.append(time.monotonic_ns())
x, c = 0, time.thread_time()
while time.thread_time() - c < 0.3:
    x += 1
marks.append(time.monotonic_ns())
print(*marks, flush=True)
sys.stdin.readline()
"""


def test_samples_are_attributed_to_the_library_that_ran():
    """torch's GEMM lands in libtorch_cpu.so (foreign); a Python loop in the interpreter (the runtime: own)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        sampler = cpu_profile.Sampler(child.pid).start()
        child.stdin.write("go\n")
        child.stdin.flush()
        t0, t1, t2 = map(int, child.stdout.readline().split())
        prof = sampler.stop()
        child.stdin.write("end\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=30)
    gemm = cpu_profile.foreign_time(prof, [[t0, t1, 10]], None, skip_calls=0)
    loop = cpu_profile.foreign_time(prof, [[t1, t2, 10]], None, skip_calls=0)
    # each sample weighs the thread's CPU time since its previous one: the phases' 0.6 s and 0.3 s within a sixth
    assert 0.5 < gemm["foreign_s"] + gemm["own_s"] < 0.7 and gemm["foreign_s"] > 5 * gemm["own_s"], gemm
    assert any(os.path.basename(k).startswith("libtorch_cpu") for k in gemm["foreign_in"]), gemm
    assert 0.25 < loop["own_s"] < 0.35 and loop["foreign_s"] < 0.1 * loop["own_s"], loop
    assert gemm["foreign_per_call_s"] == pytest.approx(gemm["foreign_s"] / 10)


def test_a_runtime_name_elsewhere_is_not_the_runtime(tmp_path):
    """The runtime is told by device and inode at the path the worker sees: a copy named libc.so.6 is foreign."""
    libc = Path(os.path.realpath(_mapped("libc.so")))
    st = libc.stat()
    real = cpu_profile.Mapping(0x1000, 0x2000, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, str(libc))
    copy = tmp_path / libc.name
    shutil.copyfile(libc, copy)
    cs = copy.stat()
    fake = cpu_profile.Mapping(0x3000, 0x4000, (os.major(cs.st_dev), os.minor(cs.st_dev)), cs.st_ino, str(copy))
    renamed = cpu_profile.Mapping(0x5000, 0x6000, real.dev, real.ino + 1, str(libc))  # right name, other file
    anon = cpu_profile.Mapping(0x7000, 0x8000, (0, 0), 0, "")
    ok = cpu_profile.trusted_files([[real, fake, renamed, anon]], None)
    assert ok == {(real.dev, real.ino)}
    prof = cpu_profile.Profile(samples=[(10, 0x1800), (11, 0x3800), (12, 0x5800), (13, 0x7800), (14, 0x9999)],
                               maps=[[real, fake, renamed, anon]], period_ns=1_000_000)
    out = cpu_profile.foreign_time(prof, [[0, 100, 1]], None, skip_calls=0)
    assert out["own_s"] == pytest.approx(0.001) and out["foreign_s"] == pytest.approx(0.004), out
    assert {"[anonymous]", "[unmapped]", str(copy)} <= set(out["foreign_in"]), out


def test_code_swapped_at_one_address_is_not_the_runtime():
    """Torch's code mapped where the runtime is mapped in another snapshot (swapped in and out between snapshots):
    which one ran there is unknown, so the time is foreign; a process whose code churns past the snapshot cap has
    all of its time foreign."""
    libc = Path(os.path.realpath(_mapped("libc.so")))
    st = libc.stat()
    real = cpu_profile.Mapping(0x1000, 0x2000, (os.major(st.st_dev), os.minor(st.st_dev)), st.st_ino, str(libc))
    other = cpu_profile.Mapping(0x1000, 0x2000, (0, 99), 12345, "/opt/torch/lib/libtorch_cpu.so")
    prof = cpu_profile.Profile(samples=[(10, 0x1800), (11, 0x1900)], maps=[[other], [real]], period_ns=1_000_000)
    out = cpu_profile.foreign_time(prof, [[0, 100, 2]], None, skip_calls=0)
    assert out["own_s"] == 0 and out["foreign_in"] == {"[remapped]": 0.002}, out
    steady = cpu_profile.Profile(samples=prof.samples, maps=[[real], [real]], period_ns=1_000_000)
    assert cpu_profile.foreign_time(steady, [[0, 100, 2]], None, skip_calls=0)["own_s"] == 0.002
    steady.churned = True
    out = cpu_profile.foreign_time(steady, [[0, 100, 2]], None, skip_calls=0)
    assert out["own_s"] == 0 and out["foreign_s"] == 0.002, out


def test_a_sample_after_kernel_work_counts_one_period_of_it_foreign():
    """A user-space sample in torch's glue that stands for 10 ms of its thread's time (the samples in between fired
    in the kernel, dropped: an munmap, page faults) counts HEAVY_SAMPLE_PERIODS periods as foreign and the rest as
    kernel time; where records were lost the whole weight stays foreign (it may be theirs), as do the samples of
    a busy torch (a period each, however many)."""
    per = 250_000
    torch = cpu_profile.Mapping(0x1000, 0x2000, (0, 99), 12345, "/opt/torch/lib/libtorch_python.so")
    heavy = cpu_profile.Profile(samples=[(10, 0x1800, 10_000_000), (11, 0x1900, per)], maps=[[torch]], period_ns=per)
    out = cpu_profile.foreign_time(heavy, [[0, 100, 1]], None, skip_calls=0)
    cap = cpu_profile.HEAVY_SAMPLE_PERIODS * per / 1e9
    assert out["foreign_s"] == round(cap + per / 1e9, 6) and out["foreign_kernel_s"] == round(0.01 - cap, 6), out
    heavy.lost = 3
    out = cpu_profile.foreign_time(heavy, [[0, 100, 1]], None, skip_calls=0)
    assert out["foreign_s"] == round(0.01 + per / 1e9, 6) and out["foreign_kernel_s"] == 0, out
    busy = cpu_profile.Profile(samples=[(t, 0x1800, per + 9_000) for t in range(10, 90)], maps=[[torch]], period_ns=per)
    assert cpu_profile.foreign_time(busy, [[0, 100, 1]], None, skip_calls=0)["foreign_s"] == round(80 * (per + 9_000) / 1e9, 6)


def _mapped(name: str) -> str:
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if os.path.basename(path).startswith(name):
            return path
    raise AssertionError(f"{name} is not mapped in this process")


def test_the_rule_names_the_library_and_the_limit():
    summary = {"calls": 10, "foreign_per_call_s": 0.003, "foreign_samples": 120,
               "foreign_in": {"/x/libtorch_cpu.so": 0.03}}
    assert cpu_profile.foreign_compute(summary, 0.010, 0.0005, 0.5) == ""  # 3 ms against 5 ms allowed
    why = cpu_profile.foreign_compute(summary, 0.002, 0.0005, 0.5)
    assert "libtorch_cpu.so 30.0 ms" in why and "1.000 ms allowed" in why and "0.5 of the reference's 2.000 ms" in why
    assert cpu_profile.foreign_compute(dict(summary, calls=0), None, 0.0005, 0.5) == ""
    # 9 samples over 4 checked calls (0.56 ms a call, an honest RMSNorm's glue once): within three standard errors
    # of nothing, so no verdict; 44 (torch's GEMM at the example's shape) are one
    few = {"calls": 4, "foreign_per_call_s": 9 * 0.00025 / 4, "foreign_samples": 9}
    assert cpu_profile.foreign_compute(few, None, 0.0005, 0.5) == ""
    assert cpu_profile.foreign_compute(dict(few, foreign_per_call_s=44 * 0.00025 / 4, foreign_samples=44),
                                       None, 0.0005, 0.5)


@pytest.mark.parametrize("example", ["cpu_12_Gemm_Multiply_LeakyReLU", "cpu_19_relu", "cpu_23_softmax"])
def test_honest_solutions_at_their_shapes_run_clean(evaluator, example):
    """The examples' own solutions, timed at the examples' shapes: profiled, no foreign compute found."""
    ex = ROOT / "skills" / "examples" / example
    files = {str(p.relative_to(ex)): p.read_text() for p in ex.rglob("*") if p.is_file() and p.name != "model.py"}
    res = evaluator.evaluate((ex / "model.py").read_text(), files, mode="both")
    prof = res["evidence"].get("cpu_profile") or {}
    assert res["correct"] and res["violations"] == [], (res["error"], prof)
    assert prof["calls"] >= 10 and prof["own_s"] > 0, prof
    assert prof["foreign_per_call_s"] < evaluator.sb.foreign_compute_floor_s, prof


def test_no_profile_is_an_infrastructure_fault(sb_cfg, monkeypatch, relu_task):
    """Where perf_event_open is refused the verdict cannot rest on the profile: no reward, the infrastructure's
    fault (the actor retries; the eval worker refuses to start at all)."""
    from sandbox_workers.evaluator import Evaluator
    from tests.sandbox.helpers import relu_solution

    monkeypatch.setattr(cpu_sampler, "_NR_PERF_EVENT_OPEN", None)
    assert "unknown syscall" in cpu_profile.available()
    ev = Evaluator(sb_cfg, "cpu")
    try:
        res = ev.evaluate(relu_task, relu_solution(), mode="verify")
    finally:
        ev.close()
    assert res["fault"] == "infra" and "CPU profile" in res["error"], res


def test_a_forged_clock_on_a_compute_bound_kernel_pays_its_profiled_time(sb_cfg):
    """Open 2 (docs/sandbox.md): the GEMM example's own kernel with its claims' clock at 1/100. The protocol's
    noise can hide a ~ms kernel from the judge's round-trip estimate, not from the samples of its library: the
    reward's time is at least the library's CPU time per call spread over every core."""
    from sandbox_workers.evaluator import Evaluator
    from sandbox_workers.reward import milestone_reward
    from tests.sandbox import redteam_cases as rc

    ex = ROOT / "skills" / "examples" / "cpu_12_Gemm_Multiply_LeakyReLU"
    files = {str(p.relative_to(ex)): p.read_text() for p in ex.rglob("*") if p.is_file() and p.name != "model.py"}
    files["model_new.py"] = rc._SCALE_CLOCK + "\n" + files["model_new.py"]
    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.static_guards = False  # the text rules refuse the clock's patch: show what stands behind them
    ev = Evaluator(cfg, "cpu")
    try:
        res = ev.evaluate((ex / "model.py").read_text(), files, mode="both")
    finally:
        ev.close()
    ev, tm = res["evidence"], res["timings"]
    why = (rc.describe(res), ev.get("cpu_profile"), ev.get("profiled_time_s"), tm)
    claim = tm["candidate"]["median_s"]
    assert res["correct"], why
    assert ev["profiled_time_s"] > 10 * claim, why  # the clock ran at 1/100
    assert ev["reward_time_s"] >= ev["profiled_time_s"], why
    te, tc = tm["eager"]["median_s"], tm["compile"]["median_s"]
    assert res["reward"] == milestone_reward(True, True, ev["reward_time_s"], te, tc), why
