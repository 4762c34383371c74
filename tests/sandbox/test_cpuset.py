"""CPU-core pinning for concurrent CPU evaluations: CPU lists, even disjoint slices, inheritance by children."""
from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from cluster.config import ConfigError, load
from sandbox_workers import cpuset


def test_parse_and_format_round_trip():
    first = cpuset.available()[0]
    assert cpuset.parse(f"{first}") == [first]
    assert cpuset.format_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


@pytest.mark.parametrize("spec, words", [("a-b", "not a CPU list"), ("3-1", "bad range"), ("99999", "not available"),
                                         (",", "names no core")])
def test_bad_cpu_lists_name_the_field_and_value(spec, words):
    with pytest.raises(ConfigError) as exc:
        load(overrides=[f"sandbox.cpu_cores={spec}"], environ={})
    assert "sandbox.cpu_cores" in str(exc.value) and words in str(exc.value)


def test_split_is_disjoint_contiguous_and_even():
    cores = list(range(10))
    parts = cpuset.split(cores, 3)
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert cpuset.split(cores, 1) == [cores]
    assert cpuset.split([0, 1], 3) == [[0], [1], [0]]  # more evaluations than cores: shared, and logged


def test_pinned_thread_pins_the_processes_it_starts_and_nothing_else():
    before = cpuset.available()
    target = before[-1:]
    seen = {}

    def work():
        cpuset.pin(target)
        seen["threads"] = cpuset.threads(0)
        out = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                             capture_output=True, text=True, check=True)
        seen["child"] = out.stdout.strip()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == {"threads": 1, "child": str(target)}
    assert cpuset.available() == before  # the caller's own thread keeps every core
    assert cpuset.threads(3) == 3


def test_up_gives_each_cpu_eval_worker_its_own_cores():
    from cluster.launch.run_loop import _roles

    cfg = load(overrides=["cluster.eval_workers=2", "sandbox.backend=cpu"], environ={})
    argv = [s.argv for s in _roles(cfg) if s.name.startswith("eval-worker")]
    got = [cpuset.parse(a[a.index("--set") + 1].split("=", 1)[1]) for a in argv]
    assert got == cpuset.split(cpuset.available(), 2)
    one = load(overrides=["cluster.eval_workers=1", "sandbox.backend=cpu"], environ={})
    assert [s.argv for s in _roles(one) if s.name.startswith("eval-worker")] == [["eval-worker", "--device", "cpu"]]
