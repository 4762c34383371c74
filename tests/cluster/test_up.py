"""`kernelrl up` end to end on the real broker, real vLLM (CPU), real DeepSpeed and the
CPU sandbox: the run report's invariants hold while roles, the embedded broker, and the
leaders and followers of a 3-node cluster are SIGKILLed."""
import json
import os
import signal
import subprocess
import time

import pytest

from schemas import topics as T
from tests.actors.helpers import RELU_DIR
from tests.cluster import poison
from tests.conftest import KERNELRL, cfg_env

RELU_MODEL = RELU_DIR / "model.py"

# Small enough for 2 cores: a few short episodes per learner step.
FAST = ["--set", "cluster.model=tiny", "--set", "actor.max_turns=3", "--set", "actor.max_new_tokens=48", "--set", "actor.concurrency=2",
        "--set", "learner.batch_trajectories=2", "--set", "learner.token_budget=8192"]


def _check_invariants(rep, steps):
    assert rep["learner_steps"] >= steps
    assert rep["trajectories_published"] >= steps * 2
    assert rep["trajectories_trained"] >= steps * 2
    assert rep["trajectories_lost"] == 0
    assert rep["tool_calls_lost"] == 0
    assert rep["trajectories_trained_twice"] == 0
    assert rep["weight_versions_published"] >= steps
    assert sum(rep["reward_histogram"].values()) == rep["episodes_finished"]
    assert all(os.path.exists(p) for p in rep["plots"])


@pytest.mark.long
@pytest.mark.timeout(1500)
def test_up_under_chaos_and_a_broker_kill_loses_nothing(cfg, tmp_path):
    """Random SIGKILLs of the roles, and a kill -9 of the embedded broker's JVM mid-run: `up` restarts the
    broker on its port and data, the roles reconnect, and the topics show nothing lost or trained twice.
    Long (140-360 s on 2 cores): its twins in the suite are the three-node test below (brokers SIGKILLed under
    `up`), each role's own SIGKILL test (actors, workers, the learner's exactly-once) and the supervisor's restarts."""
    from cluster.broker import embedded as broker
    from cluster.config import load

    env = cfg_env(cfg)
    env.pop("KRL__BUS__BOOTSTRAP_SERVERS")  # this run owns an embedded broker of its own
    env["KRL__BROKER__STATE_DIR"] = str(tmp_path / "broker")
    report = tmp_path / "report.json"
    # each role is killed at most once, so a short interval cannot starve the run, and a warm ~90 s run
    # still sees several kills (with 35 s, one run finished after a single kill)
    proc = subprocess.Popen(KERNELRL + FAST + ["up", "--backend", "cpu", "--no-dashboard", "--report", str(report),
                                               "--max-steps", "2", "--policy", "vllm", "--scripted-actors", "1",
                                               "--chaos", "15"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    own = load(environ=env)
    deadline = time.monotonic() + 300
    while not broker.status(own)["reachable"] and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(1)
    first = broker.status(own)
    assert first["reachable"], "the run's broker never came up"
    time.sleep(45)  # the roles are up and consuming
    os.kill(first["pid"], signal.SIGKILL)
    out, err = proc.communicate(timeout=1300)
    assert report.exists(), f"no report; rc={proc.returncode}\n{out[-3000:]}\n{err[-6000:]}"
    rep = json.loads(report.read_text())
    assert proc.returncode == 0, (rep, err[-4000:])
    assert rep["broker_restarts"] == 1 and len(rep["broker_outages_s"]) == 1, rep
    assert sum(rep["chaos_kills"].values()) >= 2, rep["chaos_kills"]
    _check_invariants(rep, 2)
    assert rep["tool_calls_sent"] >= 2
    assert not broker.status(own)["running"]  # the run's broker (the restarted one) is gone with the run


def test_up_reports_a_failed_start_and_exits_non_zero(cfg, tmp_path):
    """A run that cannot start still writes its report, with the reason, and no traceback."""
    report = tmp_path / "report.json"
    env = cfg_env(cfg)
    env["KRL__ACTOR__POLICY"] = "vllm"
    env["KRL__CLUSTER__MODEL"] = "tiny"
    env["KRL__CLUSTER__ISOLATE_RUNS"] = "true"
    env["KRL__BUS__BOOTSTRAP_SERVERS"] = "127.0.0.1:1"  # nothing listens there
    env["KRL__BUS__REQUEST_TIMEOUT_S"] = "5"
    proc = subprocess.run(KERNELRL + ["up", "--backend", "cpu", "--no-dashboard", "--report", str(report)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rep = json.loads(report.read_text())
    assert rep["ok"] is False and rep["error"], rep


@pytest.mark.timeout(900)  # ~330 s on 2 cores: a stall fails in 15 min, not 25 (CI's limit is 90 for all)
def test_up_on_three_brokers_survives_leader_and_follower_kills(cfg, tmp_path):
    """The whole loop (real broker, vLLM actor with hot-swap, scripted actor, compile and evaluation workers,
    DeepSpeed learner) on a 3-node KRaft cluster (topics with 3 replicas, 2 in sync): the leaders of the
    trajectories and tool-call partitions are SIGKILLed mid-run, then a follower, each node brought back
    on its data; malformed records of every kind are produced onto the tasks, trajectories and weights
    topics; from the topics: nothing lost, nothing trained twice, every tool call answered, every malformed
    record dead-lettered with its reason, and every role left on SIGTERM at the end."""
    from cluster.broker import nodes as broker_cluster
    from cluster.config import load

    env = cfg_env(cfg)
    env["KRL__BROKER__STATE_DIR"] = str(tmp_path / "kafka3")
    own = load(environ={k: v for k, v in env.items() if k != "KRL__BUS__BOOTSTRAP_SERVERS"})
    st = broker_cluster.start(own, nodes=3, tie_to_parent=True)
    env["KRL__BUS__BOOTSTRAP_SERVERS"] = st["bootstrap"]
    env["KRL__TOPICS__REPLICATION_FACTOR"] = "3"
    report = tmp_path / "report.json"
    proc = subprocess.Popen(KERNELRL + FAST + ["up", "--backend", "cpu", "--no-dashboard", "--report", str(report),
                                               "--max-steps", "2", "--policy", "vllm", "--scripted-actors", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    killed = []
    try:
        def partition0(suffix):
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                got = broker_cluster.leaders(own, st["bootstrap"], suffix)
                if got and all(len(p["isr"]) == 3 for t in got.values() for p in t.values()):
                    return next(iter(got.values()))[0]
                time.sleep(1)
            raise AssertionError(f"{suffix}: partitions never had 3 in-sync replicas: {got}")

        def kill_and_restore(node):
            broker_cluster.kill(own, node)
            killed.append(node)
            time.sleep(12)
            broker_cluster.start(own, nodes=3, tie_to_parent=True)

        time.sleep(40)  # the roles are up and exchanging records
        run_bus = _run_bus(own, st["bootstrap"])
        injected = poison.inject(run_bus, own.learner.model_name, RELU_MODEL.read_text())  # malformed input
        kill_and_restore(partition0(".trajectories")["leader"])
        kill_and_restore(partition0(".tool.compile")["leader"])
        p = partition0(".trajectories")
        kill_and_restore(next(n for n in p["isr"] if n != p["leader"]))  # a follower
        out, err = proc.communicate(timeout=700)
        lost, why = poison.unaccounted(run_bus, injected, {T.TASKS: "actors", T.TRAJECTORIES: "learner"})
        run_bus.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        broker_cluster.stop(own, timeout_s=10)
    assert len(killed) == 3
    assert report.exists(), f"no report; rc={proc.returncode}\n{out[-3000:]}\n{err[-6000:]}"
    rep = json.loads(report.read_text())
    assert proc.returncode == 0, (rep, err[-4000:])
    _check_invariants(rep, 2)
    assert rep["tool_calls_sent"] >= 2  # the scripted actor's compile/verify went through the workers
    assert rep["weight_versions_applied_min"] >= 1  # every actor hot-swapped at least once
    assert rep["killed_at_stop"] == []  # every role left on SIGTERM within its grace
    # the malformed records: each dead-lettered with its reason (trajectories once), none consumed silently
    assert lost == [], lost
    faults = {(r["topic"], r["fault"]) for r in injected}
    assert {f for f in faults if f[0] != T.TASKS} <= set(why), sorted({f for f in faults if f[0] != T.TASKS} - set(why))
    assert all(len(why[f]) == 1 for f in why if f[0] == T.TRAJECTORIES), why
    reasons = {f: " ".join(e) for f, e in why.items()}
    for fault, words in (((T.TRAJECTORIES, "ids outside the vocabulary"), "outside the model's vocabulary"),
                         ((T.TRAJECTORIES, "arrays disagree"), "logprobs has shape"),
                         ((T.WEIGHTS, "weights that are nowhere"), "are not in"),
                         ((T.WEIGHTS, "version 99"), "newer than this kernelrl reads")):
        assert words in reasons[fault], (fault, reasons[fault])
    if (T.TASKS, "unknown backend") in why:
        assert "task refused: backend 'quantum'" in reasons[(T.TASKS, "unknown backend")]
    assert rep["tasks_dead_lettered"] == sum(1 for f in why if f[0] == T.TASKS and f[1] in
                                             ("unknown backend", "no reference model"))


def _run_bus(own, bootstrap):
    """A bus on the run's own topics (`up` isolates each run under <prefix><run id>.)."""
    import copy

    from cluster.broker import nodes as broker_cluster
    from cluster.bus.client import Bus

    deadline = time.monotonic() + 60
    while not (names := [t for t in broker_cluster.leaders(own, bootstrap, "." + T.TRAJECTORIES)
                         if t.startswith(own.bus.topic_prefix)]):
        assert time.monotonic() < deadline, "the run's topics never appeared"
        time.sleep(1)
    cfg = copy.deepcopy(own)
    cfg.bus.bootstrap_servers, cfg.bus.topic_prefix = bootstrap, names[0][:-len(T.TRAJECTORIES)]
    return Bus(cfg, client_id="poison-drill")
