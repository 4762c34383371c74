"""Red team: cheats a reward-optimising policy would write, each of which must end at reward -1.

The cases are data (tests/sandbox/redteam_cases.py); this file runs them in family order on
shared evaluators and, after each family, checks that the same evaluator's next honest
evaluation is unaffected (reward >= 1). Most cases run with the static guards off (the
`nostatic` evaluator): what must stop them is the structure of the oracle (the judge in
another process with fresh secret inputs and every output compared, the judge's own clock,
the OS sandbox, seccomp), not text rules. Cases on the `static` evaluator are first shown to
get past the text rules of guards.py, so that what refuses them is the binary policy or the
structure. Some cases check the host afterwards (`post`): no process carrying the case's
token survives, the trusted caches are byte-for-byte unchanged, nothing was planted in the
host's /tmp or /dev/shm.

A case that reveals a hole (a cheat rewarded >= 1) is marked xfail(strict=True) with the
diagnosis as the reason (`Case.hole`); the test is never weakened to pass.

The must-pass half of "honest work wrongly judged" is at the end of this file.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import secrets
import time
from pathlib import Path

import pytest

from tests.sandbox import redteam_cases as rc
from tests.sandbox.helpers import relu_solution, relu_with_body, shrunk_task


# ---------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def evs(evaluator, sb_cfg):
    from sandbox_workers.evaluator import Evaluator

    def make(**kw):
        cfg = copy.deepcopy(sb_cfg)
        for k, v in kw.items():
            setattr(cfg.sandbox, k, v)
        return Evaluator(cfg, "cpu")

    out = {"static": evaluator,
           "nostatic": make(static_guards=False),
           # cached baselines are reused even when noisy (this machine is shared): one eager measurement; the
           # time claims enforced on the CPU backend too (its default records them without rejecting)
           "timing": make(static_guards=False, compile_baseline=False, baseline_max_cv=0.0,
                          enforce_timing_claims="all"),
           "timing_default": make(static_guards=False, compile_baseline=False, baseline_max_cv=0.0),
           "deadline": make(static_guards=False, eval_timeout_s=10.0)}
    yield out
    for k, ev in out.items():
        if k != "static":
            ev.close()


@pytest.fixture(scope="module")
def ctx(evs) -> rc.Ctx:
    from sandbox_workers import compiler

    ev = evs["nostatic"]
    built = compiler.compile_workspace(relu_solution(), "cpu", ev.cfg)
    assert built.ok, built.error + built.log
    torch_dir = Path(importlib.util.find_spec("torch").origin).parent
    return rc.Ctx(ref_root=ev.ref_root, artifact_root=compiler.artifact_root(ev.cfg), honest_artifact=built.library,
                  token="k" + secrets.token_hex(5), torch_lib=str(torch_dir / "lib"))


_TASK_SRC: dict[str, str] = {}


def task_source(name: str) -> str:
    if name not in _TASK_SRC:
        rel, consts = rc.TASKS[name]
        _TASK_SRC[name] = shrunk_task(rel, **consts)
    return _TASK_SRC[name]


# ---------------------------------------------------------------- host-side checks
def _snapshot(*roots: Path) -> dict[str, str]:
    out = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            if p.is_file() and p.name != ".lock":
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _survivors(token: str, wait_s: float = 10.0) -> list[str]:
    """Live processes or threads on this host whose name or command line carries the case's token.

    The sandbox's PID namespace is torn down when its outer bwrap is killed; for a moment the killed
    candidate can still be a zombie (state Z) waiting for the namespace's init: dead, not a survivor.
    """
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                names = [Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
                         for t in os.listdir(f"/proc/{pid}/task")]
            except (OSError, IndexError):
                continue
            if (token.encode() in cmd or token in names) and state not in ("Z", "X"):
                found.append(f"{pid} ({state}): {cmd[:200]!r} {sorted(set(names))[:5]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


# ---------------------------------------------------------------- the cases, family by family
def _items():
    for fam in rc.FAMILIES:
        for case in (c for c in rc.CASES if c.family == fam):
            marks = [pytest.mark.xfail(strict=True, reason=case.hole)] if case.hole else []
            yield pytest.param(case, id=f"{fam}-{case.name}", marks=marks)
        if fam in rc.HONEST_AFTER:
            yield pytest.param(fam, id=f"{fam}-honest-after")


@pytest.mark.parametrize("item", list(_items()))
def test_redteam(item, evs, ctx):
    if isinstance(item, str):  # the family's cheats left nothing behind that changes an honest evaluation
        ev_name, mode = rc.HONEST_AFTER[item]
        res = evs[ev_name].evaluate(task_source(rc.HONEST_TASK.get(item, "relu")), rc.honest_files(item), mode=mode)
        assert res["reward"] >= 1.0 and res["correct"] and res["violations"] == [], rc.describe(res)
        return
    case: rc.Case = item
    from sandbox_workers import compiler, guards

    ev = evs[case.ev]
    files = case.build(ctx)
    task = task_source(case.task)
    if case.ev == "static":  # the static guards are on: show the text rules are not what refuses it
        assert guards.check_python(files["model_new.py"]) == [], "the Python text rules already refuse this case"
    if case.text_evades:
        assert guards.check_cpp(files, "cpu") == [], "the C++ text rules already refuse this case"
    before = None
    if "caches_unchanged" in case.post:
        built = compiler.compile_workspace(files, "cpu", ev.cfg)  # its own artifact exists before the snapshot
        assert built.ok, built.error + built.log
        if case.mode != "verify":
            ev.baselines(task)  # and so do the baselines it would read
        before = _snapshot(ev.ref_root, compiler.artifact_root(ev.cfg))
        assert before, "nothing in the trusted caches to protect"
    t0 = time.monotonic()
    res = ev.evaluate(task, files, mode=case.mode)
    took = time.monotonic() - t0
    print(f"{case.family}/{case.name}: {took:.1f} s, reward {res['reward']}, violations {res['violations']}, "
          f"error {res['error'][:300]!r}")
    if "no_survivor" in case.post:
        assert _survivors(ctx.token) == [], "processes of the candidate survived the evaluation"
    if "no_host_plant" in case.post:
        for d in ("/tmp", "/dev/shm"):
            assert not os.path.exists(f"{d}/krt-{ctx.token}"), f"the candidate wrote into the host's {d}"
    if before is not None:
        after = _snapshot(ev.ref_root, compiler.artifact_root(ev.cfg))
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert changed == [], f"trusted cache files changed: {changed}"
    rc.check_outcome(case, res)


# ---------------------------------------------------------------- honest work wrongly judged: these must PASS
def test_big_output_compared_in_full_passes(evs):
    # 4.2M output elements (> 2**22, where the old oracle switched to sampled positions): every one is compared,
    # and an honest kernel passes (the one-element error in the same output is the cheat case above)
    res = evs["nostatic"].evaluate(task_source("relu_big"), relu_with_body(rc.SERIAL), mode="verify")
    assert res["reward"] == 1.0 and res["correct"], rc.describe(res)


def test_inputs_over_512_mb_are_handled(sb_cfg):
    # 2 x 68M float32 = 544 MB (519 MiB) of input and as much output: no file-size limit (arena, logs, tmpfs) in
    # the way. One correctness call instead of five keeps it to ~30 s on a 2-core machine.
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.correctness_trials = 1
    cfg.sandbox.eval_timeout_s = 300.0
    ev = Evaluator(cfg, "cpu")
    task = shrunk_task("level1/19_ReLU.py", batch_size=2, dim=68_000_000)
    t0 = time.monotonic()
    res = ev.evaluate(task, relu_solution(), mode="verify")
    print(f"544 MB input: {time.monotonic() - t0:.1f} s")
    assert res["reward"] == 1.0 and res["correct"], rc.describe(res)


def test_noisy_cached_baseline_is_measured_again(sb_cfg):
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.compile_baseline = False
    cfg.sandbox.baseline_max_cv = 0.25
    ev = Evaluator(cfg, "cpu")
    task = task_source("relu")
    path = ev.ref_root / ev.baseline_key(task) / "baselines.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    noisy = {"eager": {"median_s": 1.0, "mean_s": 1.0, "stdev_s": 0.9, "min_s": 0.1, "n": 5, "batch": 1, "cv": 0.9},
             "versions": {}}
    path.write_text(json.dumps(noisy))
    got = ev.baselines(task)
    assert got["cached"] is False, got  # noisy: measured again, not served from the cache
    assert 0 < got["eager"]["median_s"] < 1.0, got  # the faster measurement is kept
    assert json.loads(path.read_text())["eager"]["median_s"] == got["eager"]["median_s"]
