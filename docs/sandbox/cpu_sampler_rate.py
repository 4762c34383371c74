"""What one task-clock sample stands for on this host (docs/sandbox.md "Who computed: the CPU profile", session 19).

A child burns 1.0 s of its thread's CPU time (CLOCK_THREAD_CPUTIME_ID) in a Python loop while the worker's sampler
follows it: the samples' count times the nominal period, against the sum of the CPU time each sample reports since the
thread's previous one (PERF_SAMPLE_READ: the event's own count). Run from the repository root:
    .venv/bin/python docs/sandbox/cpu_sampler_rate.py
"""
import statistics
import subprocess
import sys
import time

sys.path.insert(0, ".")
from sandbox_workers import cpu_sampler

LOOP = "import time\nt = time.thread_time()\nwhile time.thread_time() - t < 1.0:\n    pass\nprint(time.thread_time() - t)"
for period in (250_000, 1_000_000, 4_000_000):
    child = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True)
    sampler = cpu_sampler.Sampler(child.pid, period_ns=period).start()
    spent = float(child.stdout.read())
    child.wait()
    prof = sampler.stop()
    ts = sorted(s[0] for s in prof.samples)
    gaps = [b - a for a, b in zip(ts, ts[1:])]
    print(f"period {period / 1e3:.0f} us: loop {spent:.3f} s of CPU (plus the interpreter's start-up); "
          f"{len(ts)} samples x period = {len(ts) * period / 1e9:.3f} s; "
          f"sum of the samples' own CPU time = {sum(s[2] for s in prof.samples) / 1e9:.3f} s; "
          f"median gap between samples {statistics.median(gaps) / 1e3:.0f} us")
    time.sleep(0.2)
