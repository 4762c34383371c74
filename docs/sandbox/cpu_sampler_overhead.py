"""What a task-clock event costs the thread it samples (docs/sandbox.md "Who computed: the CPU profile", Limits).

A child counts loop iterations in 0.5 s of its own thread's CPU time, six times; the best of the six with 0, 1 and 2
samplers attached (no reading: collect=False), four rounds alternating. The interrupt is charged to the sampled
thread's CPU clock, so fewer iterations fit. Run from the repository root: .venv/bin/python docs/sandbox/cpu_sampler_overhead.py
"""
import subprocess
import sys
import time

sys.path.insert(0, ".")
from sandbox_workers import cpu_sampler

CHILD = ("import sys, time\nsys.stdin.readline()\nfor r in range(6):\n t = time.thread_time()\n n = 0\n"
         " while time.thread_time() - t < 0.5:\n  n += 1\n print(n, flush=True)\n")


def best(samplers: int) -> int:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    on = [cpu_sampler.Sampler(child.pid, collect=False).start() for _ in range(samplers)]
    child.stdin.write("go\n")
    child.stdin.flush()
    n = max(int(child.stdout.readline()) for _ in range(6))
    for s in on:
        s.stop()
    child.wait()
    return n


runs: dict[int, list[int]] = {0: [], 1: [], 2: []}
for _ in range(4):
    for k in runs:
        runs[k].append(best(k))
for k, v in runs.items():
    print(f"{k} event(s) on the thread: best {max(v)} iterations per 0.5 s of its CPU time, {max(v) / max(runs[0]):.3f}x")
