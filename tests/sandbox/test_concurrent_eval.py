"""Several evaluations in flight on one device (CPU backend, real sandboxes): every timed section exclusive, the
other jobs' processes frozen during it, and the same rewards as one job at a time (sandbox_workers/device_gate.py)."""
from __future__ import annotations

import copy
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandbox_workers import device_gate
from tests.sandbox.conftest import fast_cfg
from tests.sandbox.helpers import RELU_TASK, shrunk_task
from tests.sandbox import redteam_cases
from tests.sandbox.redteam_cases import CALL, MEDIUM, ZEROS, fwd

TOL_S = 0.002  # a spy's timestamp this close to a window's edge is not counted (clock reads vs. stop/continue)

# a thread of the candidate's own, started when its module loads, writing a timestamp every 2 ms for as long as the
# process runs (the kind of background work that must not run while another job is timed)
SPY = """
import threading as _th
import time as _tm
def _spy(path={path!r}):
    with open(path, "a", buffering=1) as f:
        while True:
            f.write(repr(_tm.monotonic()) + "\\n")
            _tm.sleep(0.002)
_th.Thread(target=_spy, daemon=True).start()
"""


# ---------------------------------------------------------------------------------------------- the gate alone
def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_gate_shared_together_exclusive_alone_and_freezes_other_sessions():
    gate = device_gate.DeviceGate("test", freeze=True)
    # another "session": a shell in its own session with a child (a sandbox's inner processes are not in its group)
    other = subprocess.Popen(["sh", "-c", "setsid sleep 60 & sleep 60"], start_new_session=True)
    try:
        with gate.spawning("other") as add:
            add(other.pid)
        time.sleep(0.3)
        tree = device_gate.descendants([other.pid])
        assert len(tree) >= 2
        gate.acquire("a", device_gate.SHARED)
        gate.acquire("b", device_gate.SHARED)  # shared holders together
        got = threading.Event()

        def excl():
            gate.acquire("c", device_gate.EXCLUSIVE, "timing")
            got.set()

        t = threading.Thread(target=excl)
        t.start()
        assert not got.wait(0.2)  # exclusive waits for the shared holders
        late = threading.Event()
        threading.Thread(target=lambda: (gate.acquire("d", device_gate.SHARED), late.set())).start()
        gate.release("a")
        gate.release("b")
        assert got.wait(5)
        assert not late.wait(0.2)  # a shared request behind a waiting exclusive one waits for it
        assert all(_state(p) in "Tt" for p in tree)  # the other session's whole tree is stopped
        gate.release("c")
        assert late.wait(5)
        assert all(_state(p) not in "Tt" for p in tree)
        gate.release("d")
        assert gate.credit_total("other") > 0  # frozen time is credited to the session's deadline
        log = gate.pop_log("c")
        assert log[0]["mode"] == "exclusive" and log[0]["frozen"] >= 2 and log[0]["t1"] > log[0]["t0"]
    finally:
        for p in device_gate.descendants([other.pid]):
            os.kill(p, signal.SIGCONT)
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()


def test_a_gate_that_leaves_judges_running_still_freezes_their_candidates():
    """CUDA's default (sandbox.gate_freeze_judges "auto"): a timed job stops the other sessions' candidate processes
    but not their trusted judges, which go on with host-only work and wait in their next request."""
    gate = device_gate.DeviceGate("test-judges", freeze=True, freeze_judges=False)
    remote = subprocess.Popen(["sh", "-c", "setsid sleep 60 & sleep 60"], start_new_session=True)
    judge = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    try:
        with gate.spawning("other") as add:
            add(remote.pid)
            add(judge.pid, judge=True)
        time.sleep(0.3)
        remote_tree, judge_tree = device_gate.descendants([remote.pid]), device_gate.descendants([judge.pid])
        assert len(remote_tree) >= 2 and len(judge_tree) >= 2
        rec = gate.acquire("timed", device_gate.EXCLUSIVE, "timing")
        assert rec["frozen"] == len(remote_tree)
        assert all(_state(p) in "Tt" for p in remote_tree)
        assert all(_state(p) not in "Tt" for p in judge_tree)
        time.sleep(0.1)
        gate.release("timed")
        assert all(_state(p) not in "Tt" for p in remote_tree)
        assert gate.credit_total("other") >= 0.1  # its candidate was frozen: the session's deadline is extended
        # the same gate freezing judges too (the CPU backend's default)
        gate.freeze_judges = True
        rec = gate.acquire("timed", device_gate.EXCLUSIVE, "timing")
        assert rec["frozen"] == len(remote_tree) + len(judge_tree)
        assert all(_state(p) in "Tt" for p in judge_tree)
        gate.release("timed")
        assert all(_state(p) not in "Tt" for p in judge_tree)
    finally:
        for proc in (remote, judge):
            for p in device_gate.descendants([proc.pid]):
                os.kill(p, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------------------------------------- real evaluations
@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from sandbox_workers import ossandbox

    root = tmp_path_factory.mktemp("concurrent")
    cfg = fast_cfg(str(root / "cache"))
    cfg.sandbox.static_guards = False  # the spy's thread and clock patch exercise the run-time side
    cfg.sandbox.compile_baseline = False
    cfg.sandbox.baseline_max_cv = 0.0
    try:
        ossandbox.mode("bwrap")
        isolated = True
    except ossandbox.IsolationUnavailable:
        cfg.sandbox.isolation, isolated = "none", False
    spy_dir = root / "spy"
    spy_dir.mkdir()
    os.chmod(spy_dir, 0o777)
    if isolated:
        ossandbox.prepare_dir(str(spy_dir))
    task = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
    return cfg, task, spy_dir, isolated


def _cases(spy_dir, isolated: bool) -> dict[str, dict]:
    where = "/spy" if isolated else str(spy_dir)
    stage_cheat = next(c for c in redteam_cases.TIMING if c.name == "work_in_stage_phase")

    def spy(name):
        return SPY.format(path=f"{where}/{name}.txt")

    return {
        # correct but 10-50x slower than eager on purpose: reward 1 whatever the noise, serial or not
        "honest_a_spy": fwd(CALL, cpp_body=MEDIUM, header=spy("honest_a_spy")),
        "honest_b_spy": fwd(CALL, cpp_body=MEDIUM, header=spy("honest_b_spy")),
        "zeros": fwd(ZEROS),  # wrong outputs: blocked
        # the work done in the untimed "stage" step on inputs it should not have yet: blocked (mismatch)
        "stage_cheat": stage_cheat.files,
    }


@pytest.fixture
def spy_bind(setup, monkeypatch):
    """Candidate sandboxes get the spy folder read-write at /spy (only in this test)."""
    from sandbox_workers import session as session_mod

    cfg, _, spy_dir, isolated = setup
    if not isolated:
        return
    orig = session_mod.Session._remote_profile

    def profile(self):
        prof = orig(self)
        if prof is not None and self.role == "candidate":
            prof.rw_binds = [*prof.rw_binds, (str(spy_dir), "/spy")]
        return prof

    monkeypatch.setattr(session_mod.Session, "_remote_profile", profile)


def _evaluate_all(cfg, task: str, cases: dict, jobs: int, baselines: str, spy_dir=None) -> tuple[dict, float, list]:
    """Every case evaluated, ``jobs`` at once. With ``spy_dir``, a timer of the test's own also takes the gate
    exclusively (as a job's timing does) for 0.2 s as soon as each spy has written its first timestamp: its model
    has just been loaded, so its judge holds the gate shared (load, verification, warm-up) and asks for it
    exclusively only later; exclusive requests are granted in order (device_gate), so the timer's window comes
    before that job's own timing, while its spy is alive, whatever order the jobs' own timed sections come in."""
    from sandbox_workers.evaluator import Evaluator

    cfg = copy.deepcopy(cfg)
    cfg.sandbox.jobs_per_device = jobs
    cfg.sandbox.baseline_cache_dir = baselines  # a fresh cache: the first job times the baselines under the gate
    ev = Evaluator(cfg, "cpu")
    windows: list[dict] = []
    done = threading.Event()

    def timer():
        seen: set[str] = set()
        while not done.is_set():
            fresh = [p.stem for p in spy_dir.iterdir() if p.stem not in seen and _spy_times(p.parent, p.stem)]
            if fresh:
                seen.update(fresh)
                ev.gate.acquire("test-timer", device_gate.EXCLUSIVE, "test")
                time.sleep(0.2)
                ev.gate.release("test-timer")
                windows.extend(dict(h, job="test-timer", spies=fresh) for h in ev.gate.pop_log("test-timer"))
            time.sleep(0.005)

    t0 = time.monotonic()
    watcher = threading.Thread(target=timer, daemon=True) if spy_dir is not None else None
    try:
        if watcher:
            watcher.start()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futs = {name: pool.submit(ev.evaluate, task, files, "both") for name, files in cases.items()}
            out = {name: f.result() for name, f in futs.items()}
    finally:
        done.set()
        if watcher:
            watcher.join(10)
        ev.close()
    return out, time.monotonic() - t0, windows


def _spy_times(spy_dir, name: str) -> list[float]:
    p = spy_dir / f"{name}.txt"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(float(line))
        except ValueError:
            pass  # a line cut by the process's end
    return out


def test_concurrent_jobs_time_alone_freeze_the_others_and_reward_as_serial(setup, spy_bind, tmp_path):
    cfg, task, spy_dir, isolated = setup
    cases = _cases(spy_dir, isolated)  # the same sources both times: the serial run builds, the concurrent one reuses
    serial, t_serial, _ = _evaluate_all(cfg, task, cases, 1, str(tmp_path / "b1"))
    for p in spy_dir.iterdir():
        p.unlink()  # the serial run's processes are gone: only the concurrent run's timestamps are read below
    conc, t_conc, test_windows = _evaluate_all(cfg, task, cases, 3, str(tmp_path / "b3"), spy_dir)
    summary = {n: (serial[n]["reward"], conc[n]["reward"], round(serial[n]["duration_s"], 2),
                   round(conc[n]["duration_s"], 2)) for n in serial}
    if os.environ.get("KRL_TEST_DUMP"):
        import json

        with open(os.environ["KRL_TEST_DUMP"], "w") as f:
            json.dump({"serial": serial, "conc": conc}, f, default=str)
    print(f"serial {t_serial:.1f} s, 3 at once {t_conc:.1f} s; (reward serial, concurrent, s, s): {summary}")

    # (c) the same verdicts as one job at a time: the honest one passes, the cheats gain nothing
    for name in serial:
        s, c = serial[name], conc[name]
        assert (c["reward"], c["correct"], sorted(c["violations"])) == \
            (s["reward"], s["correct"], sorted(s["violations"])), (name, s["error"][:500], c["error"][:500])
    for name in ("honest_a_spy", "honest_b_spy"):
        assert conc[name]["reward"] == 1.0, conc[name]["error"][:1500]
    assert conc["zeros"]["reward"] == -1.0 and "mismatch" in conc["zeros"]["error"]
    cheat = conc["stage_cheat"]
    assert cheat["reward"] == -1.0 and ("mismatch" in cheat["error"] or
                                        redteam_cases.CONTRADICTED in cheat["violations"]), cheat["error"][:1500]

    # (a) every timed section is disjoint from every other job's device phases (shared or exclusive)
    holds = {n: r["evidence"].get("gate") or [] for n, r in conc.items()}
    excl = {n: [h for h in hs if h["mode"] == "exclusive"] for n, hs in holds.items()}
    assert excl["honest_a_spy"] and excl["honest_b_spy"], holds  # timed: reference + probe, the candidate's trials
    assert any(h["role"] == "baseline" for hs in excl.values() for h in hs)  # the baselines too (fresh cache)
    for n, hs in excl.items():
        for h in hs:
            assert h["t1"] is not None and h["t1"] >= h["t0"]
            for m, others in holds.items():
                if m == n:
                    continue
                for g in others:
                    assert g["t1"] <= h["t0"] or g["t0"] >= h["t1"], (n, h, m, g)
    spans = {n: (min(h["t0"] for h in hs), max(h["t1"] for h in hs)) for n, hs in holds.items() if hs}
    assert any(a[0] < b[1] and b[0] < a[1] for n, a in spans.items() for m, b in spans.items() if n < m), \
        f"the jobs never overlapped: nothing was pipelined ({spans})"

    # (b) while a job was timed (or the test's own timer held the gate), the other jobs' candidate processes (and
    # their threads) were stopped
    checked = 0
    for name in ("honest_a_spy", "honest_b_spy"):
        ts = _spy_times(spy_dir, name)
        assert len(ts) > 50, f"the spy of {name} wrote {len(ts)} timestamps"
        lo, hi = ts[0], ts[-1]
        for m, hs in [*excl.items(), ("test-timer", test_windows)]:
            if m == name:
                continue
            for h in hs:
                if h["t1"] - h["t0"] <= 2 * TOL_S or h["t1"] < lo or h["t0"] > hi:
                    continue
                inside = [t for t in ts if h["t0"] + TOL_S < t < h["t1"] - TOL_S]
                assert not inside, f"{name}'s thread ran {len(inside)} times inside {m}'s timed window {h}"
                checked += 1
    assert checked, "no other job was timed while a spy ran: nothing was checked"
    print(f"{checked} timed window(s) of other jobs checked against the spies")
