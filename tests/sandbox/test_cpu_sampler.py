"""The sampler's attach (sandbox_workers/cpu_sampler.py) on real processes: the process of interest, a grandchild of
the sampled root found by its command line, has each thread's CPU time counted once, whether its events reached it by
inheritance, were missed by the first scan of the tree, or were attached twice."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox_workers import cpu_profile, cpu_sampler

MARKER = "krl_sampler_probe"
PROBE = r"""
import sys, threading, time
sys.stdin.readline()
def busy(out):
    t = time.thread_time()
    while time.thread_time() - t < 0.5:
        pass
    out.append(time.thread_time() - t)
marks, spent = [time.monotonic_ns()], []
busy(spent)
th = [threading.Thread(target=busy, args=(spent,)) for _ in range(2)]  # threads born after the attach inherit
for x in th:
    x.start()
for x in th:
    x.join()
marks.append(time.monotonic_ns())
print(marks[0], marks[1], sum(spent), flush=True)
sys.stdin.readline()
"""
LAUNCHER = "import subprocess, sys, time; time.sleep(float(sys.argv[1])); " \
           f"sys.exit(subprocess.call([sys.executable, '-m', '{MARKER}']))"


def _probe(tmp_path, launch_after_s: float, first_scan_misses: bool, monkeypatch,
           probe: str = PROBE) -> tuple[dict, float, cpu_sampler.Profile, list[str]]:
    """Run ``probe`` under the launcher, sampled; it prints its window, its CPU time and any further words (returned
    last) on "go"."""
    (tmp_path / f"{MARKER}.py").write_text(probe)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    root = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(launch_after_s)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)
    if first_scan_misses:  # step 1 sees the launcher only: the probe has no events until the sampler finds it
        monkeypatch.setattr(cpu_sampler.Sampler, "_initial_tids", lambda self: cpu_sampler.threads(self.root))
    try:
        if launch_after_s == 0:
            time.sleep(1.0)  # the probe is running before the sampler starts
        sampler = cpu_sampler.Sampler(root.pid, marker=MARKER.encode()).start()
        time.sleep(1.0 + launch_after_s)  # found while it waits for "go"
        root.stdin.write("go\n")
        root.stdin.flush()
        t0, t1, spent, *extra = root.stdout.readline().split()
        prof = sampler.stop()
        root.stdin.write("end\n")
        root.stdin.flush()
    finally:
        root.wait(timeout=60)
    out = cpu_profile.foreign_time(prof, [[int(t0), int(t1), 1]], None, skip_calls=0)
    return out, float(spent), prof, extra


@pytest.mark.parametrize("launch_after_s, first_scan_misses", [(0.5, False), (0, False), (0, True)],
                         ids=["inherited", "attached-twice", "missed-by-the-first-scan"])
def test_each_thread_of_the_process_is_counted_once(tmp_path, monkeypatch, launch_after_s, first_scan_misses):
    out, spent, prof, _ = _probe(tmp_path, launch_after_s, first_scan_misses, monkeypatch)
    sampled = out["own_s"] + out["foreign_s"]
    assert prof.threads >= 1, out
    # every sample stands for some of its thread's CPU time (its event's count since that thread's previous sample)
    assert min(w for _, _, w in prof.samples) > 0, out
    # 1.5 s of thread CPU time in three threads, sampled every 250 us: within a fifth, never doubled, never missing
    assert 0.8 * spent < sampled < 1.2 * spent, (spent, out)


REUSE = r"""
import sys, threading, time
sys.stdin.readline()
def busy(s, out):
    t = time.thread_time()
    while time.thread_time() - t < s:
        pass
    out.append(threading.get_native_id())
marks, c0, first = [time.monotonic_ns()], time.process_time(), []
a = threading.Thread(target=busy, args=(0.6, first))
a.start(); a.join()
tries, again = 0, []
while tries < 200000:  # threads that end at once, until one gets the first one's thread id back
    tries += 1
    x = threading.Thread(target=lambda: again.append(threading.get_native_id()))
    x.start(); x.join()
    if again[-1] == first[0]:
        break
    again.clear()
reused = bool(again) and again[-1] == first[0]
b = threading.Thread(target=busy, args=(0.3, []))  # the next thread after the reused one may reuse it too: both ran
b.start(); b.join()
marks.append(time.monotonic_ns())
print(marks[0], marks[1], time.process_time() - c0, int(reused), tries, flush=True)
sys.stdin.readline()
"""


def test_a_reused_thread_id_does_not_cancel_the_time_of_the_thread_that_had_it(tmp_path, monkeypatch):
    """A thread's weights are its event's count since its previous sample; a new thread under an old thread's id
    (ids wrap at pid_max, 32768 here: a candidate can cycle them in a second) starts counting from zero again, and
    its first sample must not weigh its count less the old thread's last (a negative weight that hides torch's time)."""
    max_pid = int(Path("/proc/sys/kernel/pid_max").read_text())
    if max_pid > 150_000:
        pytest.skip(f"kernel.pid_max is {max_pid}: thread ids are not reused within a test's time here")
    out, spent, prof, (reused, tries) = _probe(tmp_path, 0.5, False, monkeypatch, probe=REUSE)
    assert reused == "1", f"no thread got the first one's id back in {tries} tries"
    sampled = out["own_s"] + out["foreign_s"]
    assert min(w for _, _, w in prof.samples) > 0, out
    # never more than the process spent (a reused id's count taken whole, not less the old thread's, can only add
    # what that thread really ran), and the ~32k short threads' time, counted at their exit, is foreign (no sample
    # says where it went). How much of a thread storm is counted varies: 0.79 of the process's CPU time in session
    # 19's runs, 0.2-0.8 in session 20's (CI and this host, no lost records): an open gap (docs/sandbox.md), so no
    # lower bound here; the red-team case short_threads_then_torch_at_the_example_shape is caught 59x over its floor
    assert 0 < sampled < 1.2 * spent, (spent, tries, out)
    assert out["foreign_s"] > 0, out
