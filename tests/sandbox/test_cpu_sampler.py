"""The sampler's attach (sandbox_workers/cpu_sampler.py) on real processes: the process of interest, a grandchild of
the sampled root found by its command line, has each thread's CPU time counted once, whether its events reached it by
inheritance, were missed by the first scan of the tree, or were attached twice."""
from __future__ import annotations

import os
import subprocess
import sys
import time

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


def _probe(tmp_path, launch_after_s: float, first_scan_misses: bool, monkeypatch) -> tuple[dict, float, int]:
    (tmp_path / f"{MARKER}.py").write_text(PROBE)
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
        t0, t1, spent = root.stdout.readline().split()
        prof = sampler.stop()
        root.stdin.write("end\n")
        root.stdin.flush()
    finally:
        root.wait(timeout=30)
    out = cpu_profile.foreign_time(prof, [[int(t0), int(t1), 1]], None, skip_calls=0)
    return out, float(spent), prof.threads


@pytest.mark.parametrize("launch_after_s, first_scan_misses", [(0.5, False), (0, False), (0, True)],
                         ids=["inherited", "attached-twice", "missed-by-the-first-scan"])
def test_each_thread_of_the_process_is_counted_once(tmp_path, monkeypatch, launch_after_s, first_scan_misses):
    out, spent, direct = _probe(tmp_path, launch_after_s, first_scan_misses, monkeypatch)
    sampled = out["own_s"] + out["foreign_s"]
    assert direct >= 1, out
    # 1.5 s of thread CPU time in three threads, sampled every 250 us: within a fifth, never doubled, never missing
    assert 0.8 * spent < sampled < 1.2 * spent, (spent, out)
