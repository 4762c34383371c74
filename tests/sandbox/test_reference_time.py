"""A candidate's judge sizes its timed batch by the reference time that a judge of the task's baselines measured
(the worker's trusted cache) instead of timing the reference again: one exclusive device section less per job.
Real CPU evaluations in the OS sandbox."""
from __future__ import annotations

import json

from sandbox_workers import device_gate
from sandbox_workers.evaluator import Evaluator
from tests.sandbox.conftest import isolated_cfg
from tests.sandbox.helpers import RELU_TASK, shrunk_task
from tests.sandbox.redteam_cases import CALL, ZEROS, fwd


def _cfg(tmp_path):
    cfg = isolated_cfg(str(tmp_path / "cache"))
    cfg.sandbox.jobs_per_device = 2  # the device gate records every hold
    # baselines timed with a spread over baseline_max_cv are measured again on their next use (on CI's loaded host
    # once, and the second job's baselines were then not the cached ones): these tests are about the reference
    # time, so a cached baseline is always taken as it is
    cfg.sandbox.baseline_max_cv = 0.0
    return cfg


def test_the_second_job_of_a_task_takes_the_reference_time_from_its_baselines(tmp_path):
    task = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
    ev = Evaluator(_cfg(tmp_path), "cpu")
    try:
        first = ev.evaluate(task, fwd(CALL), "both")
        second = ev.evaluate(task, fwd(CALL), "both")
        cheat = ev.evaluate(task, fwd(ZEROS), "both")
        meta = json.loads((ev.ref_root / ev.baseline_key(task) / "baselines.json").read_text())
    finally:
        ev.close()
    assert first["correct"] and second["correct"], (first["error"], second["error"])
    assert first["evidence"]["t_ref_source"] == "measured" and second["evidence"]["t_ref_source"] == "baselines"
    assert meta["t_ref"] > 0  # measured by the baselines' judge, before any model code in its session
    # judged alike: honest and paid at least as correct (the speed tier of a borderline kernel varies with the
    # host's noise); the second job timed in the baselines' batch by construction (the first sized its own from
    # its own measurement of the reference, which may land on another power of two)
    assert first["reward"] >= 1 and second["reward"] >= 1, (first["reward"], second["reward"])
    eager = second["timings"]["eager"]
    assert second["timings"]["candidate"]["batch"] == eager["batch"], (second["timings"]["candidate"], eager)
    # the second job timed the reference nowhere: no such phase, no such exclusive section
    phases = second["evidence"]["phases"]["candidate"]
    assert "time_reference_s" not in phases and "probe_s" in phases, phases
    holds = [h for h in second["evidence"]["gate"] if h["role"] == "candidate"]
    excl = [h["phase"] for h in holds if h["mode"] == device_gate.EXCLUSIVE]
    assert excl == ["probe", "candidate.timing"], holds
    assert "time_reference+probe" in [h["phase"] for h in first["evidence"]["gate"]]
    # the cached time changes nothing about what is caught
    assert not cheat["correct"] and cheat["reward"] == -1.0 and cheat["evidence"]["t_ref_source"] == "baselines"


def test_with_the_switch_off_every_job_times_the_reference_again(tmp_path):
    """`sandbox.reference_time_from_baselines = false` (for measuring what the cached time saves): a task's
    second job, its baselines cached, still measures the reference in its own session."""
    cfg = _cfg(tmp_path)
    cfg.sandbox.reference_time_from_baselines = False
    task = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
    ev = Evaluator(cfg, "cpu")
    try:
        ev.evaluate(task, fwd(CALL), "both")
        second = ev.evaluate(task, fwd(CALL), "both")
    finally:
        ev.close()
    assert second["correct"] and second["evidence"]["baseline_cached"], second["error"]
    assert second["evidence"]["t_ref_source"] == "measured"
    assert "time_reference+probe" in [h["phase"] for h in second["evidence"]["gate"] if h["role"] == "candidate"]
