"""Supervisor restarts, kills and stops real child processes; metrics endpoint serves real numbers."""
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from cluster import metrics
from cluster.launch.supervisor import RoleSpec, Supervisor

# A child that serves metrics, counts up, and exits 0 when told to by a file.
CHILD = r"""
import os, sys, time, pathlib
from cluster import metrics
metrics.serve_from_env("probe")
mode = sys.argv[1]
if mode == "crash":
    time.sleep(0.2); sys.exit(3)
if mode == "stubborn":
    import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    metrics.inc("ticks")
    if mode == "main" and pathlib.Path(sys.argv[2]).exists():
        sys.exit(0)
    time.sleep(0.05)
"""


def _wait(pred, timeout=15.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_restart_scrape_kill_and_stop(tmp_path):
    sup = Supervisor(tmp_path / "logs", [sys.executable, "-c", CHILD], base_env={**os.environ, "PYTHONPATH": os.getcwd()})
    flag = tmp_path / "done"
    sup.add(RoleSpec("crasher", ["crash"]))
    sup.add(RoleSpec("steady", ["steady"]))
    sup.add(RoleSpec("main", ["main", str(flag)], main=True))
    try:
        assert _wait(lambda: (sup.poll() or True) and sup.roles["crasher"].starts >= 2), "crashed role not restarted"
        assert 3 in sup.roles["crasher"].exit_codes
        assert _wait(lambda: (sup.scrape("steady") or {}).get("counters", {}).get("ticks", 0) > 2)
        assert sup.scrape("steady")["info"]["role"] == "probe"
        pid = sup.roles["steady"].proc.pid
        sup.kill("steady", signal.SIGKILL)
        assert _wait(lambda: (sup.poll() or True) and sup.roles["steady"].alive and sup.roles["steady"].proc.pid != pid)
        flag.write_text("x")
        finished = []
        assert _wait(lambda: bool(finished.extend(sup.poll()) or finished))
        assert finished == ["main"]
    finally:
        sup.stop(grace_s=5)
    assert not any(rp.alive for rp in sup.roles.values())
    assert "=== start" in (tmp_path / "logs" / "steady.log").read_text()


def test_metrics_endpoint_prometheus_and_health():
    reg = metrics.Registry()
    server = metrics.serve(0, registry=reg)
    port = server.server_address[1]
    try:
        reg.inc("jobs_done", 2)
        reg.set("weight_version", 3)
        for v in (0.1, 0.2, 0.3):
            reg.observe("latency_s", v)
        reg.bucket("reward", 3)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        assert "kernelrl_jobs_done_total 2.0" in text and "kernelrl_weight_version 3.0" in text
        assert 'kernelrl_reward{value="3"} 1' in text
        snap = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics.json").read())
        assert snap["summaries"]["latency_s"]["count"] == 3 and snap["summaries"]["latency_s"]["p50"] == 0.2
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz").status == 200
        reg.health = lambda: False
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz")
            raise AssertionError("unhealthy role answered 200")
        except urllib.error.HTTPError as e:
            assert e.code == 503
    finally:
        server.shutdown()


def test_metered_handler_counts_jobs_and_failures():
    reg = metrics.Registry()

    class Handler:
        name = "h"

        def __call__(self, msg):
            if msg == "bad":
                raise ValueError(msg)
            return msg.upper()

    h = metrics.Metered(Handler(), registry=reg)
    assert h("ok") == "OK" and h.name == "h"
    try:
        h("bad")
    except ValueError:
        pass
    snap = reg.snapshot()
    assert snap["counters"]["jobs_done"] == 1 and snap["counters"]["jobs_failed"] == 1
    assert snap["summaries"]["job_s"]["count"] == 2 and snap["gauges"]["busy"] == 0


def test_stop_kills_and_names_a_role_that_ignores_sigterm(tmp_path):
    sup = Supervisor(tmp_path / "logs", [sys.executable, "-c", CHILD], base_env={**os.environ, "PYTHONPATH": os.getcwd()})
    sup.add(RoleSpec("steady", ["steady"]))
    sup.add(RoleSpec("stubborn", ["stubborn"], grace_s=1.0))
    try:
        assert _wait(lambda: all((sup.scrape(n) or {}).get("counters", {}).get("ticks", 0) > 2
                                 for n in ("steady", "stubborn")))
    finally:
        sup.stop()
    assert sup.killed_at_stop == ["stubborn"]
    assert sup.roles["stubborn"].proc.returncode == -signal.SIGKILL
    assert sup.roles["steady"].proc.returncode == -signal.SIGTERM


# A role that, on SIGTERM, takes a moment to finish (as an actor finishing its episodes) and records whether the
# other roles were still running (never told to stop) while it did: the workers must answer its last tool calls.
DRAINER = r"""
import os, pathlib, signal, sys, time
out, others = pathlib.Path(sys.argv[1]), sys.argv[2:]
def on_term(*_):
    time.sleep(0.5)
    out.write_text(" ".join(o for o in others if not pathlib.Path(o).exists()))
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(str(out) + ".up").write_text("up")
while True:
    time.sleep(0.05)
"""
WORKER = r"""
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (pathlib.Path(sys.argv[1]).write_text("stopped"), sys.exit(0)))
pathlib.Path(sys.argv[1] + ".up").write_text("up")
while True:
    time.sleep(0.05)
"""


def test_actors_stop_first_while_the_workers_they_call_still_run(tmp_path):
    sup = Supervisor(tmp_path / "logs", [sys.executable, "-c"], base_env={**os.environ, "PYTHONPATH": os.getcwd()})
    worker_marks = [str(tmp_path / f"worker-{i}") for i in range(2)]
    for i, mark in enumerate(worker_marks):
        sup.add(RoleSpec(f"worker-{i}", [WORKER, mark]))
    out = tmp_path / "drainer.txt"
    sup.add(RoleSpec("actor-0", [DRAINER, str(out), *worker_marks], stop_first=True))
    try:
        assert _wait(lambda: all(os.path.exists(m + ".up") for m in [*worker_marks, str(out)]))  # handlers set
    finally:
        sup.stop()
    assert out.read_text().split() == worker_marks  # both workers untouched while the actor finished
    assert all(Path(m).read_text() == "stopped" for m in worker_marks)  # then stopped in turn
    assert not sup.killed_at_stop


# A role that leaves a process in its own session behind (as a vLLM engine core may), then waits.
LEAVER = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(600)
"""

# The supervisor in a process of its own: the subreaper flag lasts for the process that sets it.
SUPERVISE = r"""
import json, os, signal, sys, time
from pathlib import Path
from cluster.launch.supervisor import RoleSpec, Supervisor
tmp = Path(sys.argv[1])
sup = Supervisor(tmp / "logs", [sys.executable, "-c", sys.argv[2]], subreaper=True)
sup.add(RoleSpec("actor", [str(tmp / "engine.pid")]))
while not (tmp / "engine.pid").exists() or not (tmp / "engine.pid").read_text():
    time.sleep(0.05)
engine = int((tmp / "engine.pid").read_text())
os.kill(sup.roles["actor"].proc.pid, signal.SIGKILL)   # the role alone dies, as under kill -9
sup.roles["actor"].proc.wait()
sup.poll()
alive = Path(f"/proc/{engine}").exists()
sup.stop(grace_s=2)
print(json.dumps({"engine_alive_after_poll": alive, "orphans_killed": sup.orphans_killed}))
"""


def test_what_a_killed_role_leaves_behind_is_killed_before_it_restarts(tmp_path):
    import subprocess

    out = subprocess.run([sys.executable, "-c", SUPERVISE, str(tmp_path), LEAVER], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["engine_alive_after_poll"] is False, got
    assert len(got["orphans_killed"]) == 1 and "time.sleep(600)" in got["orphans_killed"][0]


def test_roles_never_share_a_metrics_port_when_the_kernel_offers_one_twice(tmp_path, monkeypatch):
    """The port probe closes before the child binds it, so the kernel may offer the same port to the next probe;
    two roles given one port left the second unable to serve metrics, restarted forever (a learning run)."""
    import socket as real_socket

    from cluster.broker import embedded

    offers = iter([41001, 41001, 41001, 41002])

    class Probe:  # the kernel's answers to bind(port 0), one per probe socket
        def __init__(self):
            self.port = next(offers)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, addr):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(embedded, "socket", type("S", (), {"socket": Probe, "AF_INET": real_socket.AF_INET}))
    sup = Supervisor(tmp_path / "logs", [sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        a = sup.add(RoleSpec("learner", []))
        b = sup.add(RoleSpec("eval-worker-0", []))
    finally:
        sup.stop(grace_s=2)
    assert (a.metrics_port, b.metrics_port) == (41001, 41002)
