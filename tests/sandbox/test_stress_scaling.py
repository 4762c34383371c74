"""`kernelrl stress sandbox --workers 1,2` against the real broker: per step the tool starts its own compile and
CPU evaluation workers, loads them, stops them with SIGTERM; the JSON has the scaling block and each step's full
report, and no worker outlives the command. No timing assertions (speed targets live in benchmarks)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import KERNELRL, cfg_env
from tests.sandbox.conftest import fast_sandbox
from tests.sandbox.helpers import ROOT


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # gone meanwhile
                continue
            if text in cmd:
                found.append(f"{proc.name}: {cmd}")
    return found


def test_scaling_steps_start_load_and_stop_their_own_workers(make_cfg, sandbox_cache):
    overrides = {f"sandbox__{k}": v for k, v in fast_sandbox(sandbox_cache).items()}
    overrides["sandbox__cpu_threads"] = 0  # each evaluation uses the cores its worker is pinned to
    cfg = make_cfg(create_topics=False, **overrides)
    r = subprocess.run([*KERNELRL, "stress", "sandbox", "--backend", "cpu", "--workers", "1,2", "--duration", "2",
                        "--examples", "19_relu", "--timeout", "120", "--json"],
                       env=cfg_env(cfg), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)  # --json: the document alone on stdout
    assert "stress scaling: step 2/2" in r.stderr  # progress on stderr
    sc = out["scaling"]
    assert sc["workers"] == [1, 2] and sc["cores"] == os.cpu_count() and sc["cores_per_worker"] >= 1, sc
    assert len(sc["evaluations_per_min"]) == 2 and all(x > 0 for x in sc["evaluations_per_min"]), sc
    assert sc["efficiency"][0] == 1.0 and sc["efficiency"][1] > 0, sc
    assert [len(sc["cpu_sets"][n]) for n in ("1", "2")] == [1, 2], sc
    if len(os.sched_getaffinity(0)) <= 2:  # two workers of one core take every core: the report says so
        assert "note" in sc and "cores" in sc["note"], sc
    assert sc["workers_exited_cleanly"] is True, [s["workers_exit"] for s in out["steps"]]
    for n, step in zip((1, 2), out["steps"]):
        assert step["workers"] == n and step["mode"] == "closed" and step["warmup"]["answered"] == step["warmup"]["n"]
        assert step["evaluate"]["n"] >= 1 and step["evaluations_per_min"] > 0, step
        assert step["timeouts"] == 0 and step["lag_end"]["evaluate"] == 0, step
        assert step["workers_exit"]["killed"] == [] and set(step["workers_exit"]["codes"].values()) == {0}, step
        # every evaluation worker of the step served the load (the closed loop keeps each one's share queued)
        assert sum(w.startswith("eval-cpu@") for w in step["worker_busy_fraction"]) == n, step
    assert _processes_mentioning(out["run_dir"]) == []  # no worker left running


def test_core_plan_gives_every_worker_the_same_cores_and_says_when_they_are_short():
    from sandbox_workers.stress_scaling import efficiency, parse_counts, plan_cores

    roomy = plan_cores([1, 2], list(range(8)))  # 3 cores each, disjoint, in both steps; cores 6-7 for the rest
    assert roomy["cores_per_worker"] == 3 and roomy["sets"] == {1: ["0-2"], 2: ["0-2", "3-5"]} and not roomy["notes"]
    assert "take all 8" in plan_cores([1, 2], list(range(8)), per_worker=4)["notes"][0]
    tight = plan_cores([1, 2], [0, 1])  # every core taken by the workers: said
    assert tight["sets"] == {1: ["0"], 2: ["0", "1"]} and "take all 2" in tight["notes"][0]
    shared = plan_cores([1, 2], [0])  # workers share a core: their timings contend, said
    assert shared["sets"][2] == ["0", "0"] and "share cores" in shared["notes"][0]
    assert "oversubscribes" in plan_cores([2], [0, 1], threads=2)["notes"][-1]
    assert efficiency([1, 2], [6.0, 10.8]) == [1.0, 0.9] and efficiency([1, 2], [0.0, 1.0]) == [None, None]
    assert parse_counts("1, 2,4") == [1, 2, 4]
    for bad in ("", "0,1", "a"):
        try:
            parse_counts(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} accepted")


def test_partition_keys_land_on_their_partitions():
    from kafka.partitioner.default import murmur2

    from sandbox_workers.stress_load import partition_keys

    for n in (1, 2, 3, 8):
        keys = partition_keys(n)
        assert [(murmur2(k.encode()) & 0x7FFFFFFF) % n for k in keys] == list(range(n))
