"""CLI and set-up paths: broker status, topics create/describe, clear errors, config validation."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from cluster import cmd_bench
from cluster.bus.client import Bus
from cluster.config import Config, ConfigError, load
from cluster.errors import RetriableError, SetupError
from schemas import topics as T
from tests.conftest import KERNELRL, ROOT, cfg_env


def kernelrl(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*KERNELRL, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_broker_status_reports_the_running_broker(kafka, tmp_path):
    if not kafka["embedded"]:
        pytest.skip("the suite runs against an external cluster (KRL__BUS__BOOTSTRAP_SERVERS was set)")
    env = {**os.environ, "KRL__BROKER__STATE_DIR": kafka["state_dir"]}
    env.pop("KRL__BUS__BOOTSTRAP_SERVERS", None)
    res = kernelrl("broker", "status", env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("running: Kafka 4.1.1 at " + kafka["bootstrap"])
    st = json.loads(kernelrl("broker", "status", "--json", env=env).stdout)
    assert st["running"] and st["reachable"] and st["bootstrap"] == kafka["bootstrap"] and st["pid"] > 0
    env["KRL__BROKER__STATE_DIR"] = str(tmp_path / "none")
    stopped = kernelrl("broker", "status", env=env)
    assert stopped.returncode == 3 and stopped.stdout.startswith("stopped")


def test_topics_create_is_idempotent_and_describe_shows_the_limits(make_cfg):
    cfg = make_cfg(create_topics=False, topics__partitions=3)
    env = cfg_env(cfg)
    missing = kernelrl("topics", "describe", env=env)
    assert missing.returncode == 3 and "MISSING" in missing.stdout
    first = kernelrl("topics", "create", env=env)
    assert first.returncode == 0, first.stderr
    assert f"{cfg.topic(T.TRAJECTORIES)}: created" in first.stdout
    second = json.loads(kernelrl("topics", "create", "--json", env=env).stdout)
    assert set(second.values()) == {"exists"} and len(second) == len(T.ALL)
    res = kernelrl("topics", "describe", "--json", env=env)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    traj = rows[cfg.topic(T.TRAJECTORIES)]
    assert traj["partitions"] == 3 and traj["configs"]["retention.ms"] == "-1"
    assert int(traj["configs"]["max.message.bytes"]) >= 8 * 1024 * 1024
    assert rows[cfg.topic(T.TOOL_REPLIES)]["partitions"] == cfg.topics.reply_partitions
    assert rows[cfg.topic(T.WEIGHTS)]["partitions"] == 1
    text = kernelrl("topics", "describe", env=env).stdout
    assert f"{cfg.topic(T.TASKS)}: partitions=3 messages=0 retention.ms=604800000" in text


def test_missing_java_is_a_clear_setup_error(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path), "KRL__BROKER__CACHE_DIR": str(tmp_path / "cache"),
           "KRL__BROKER__STATE_DIR": str(tmp_path / "state")}
    env.pop("KRL__BUS__BOOTSTRAP_SERVERS", None)
    res = kernelrl("broker", "start", env=env)
    assert res.returncode == 1
    assert "'java' not found" in res.stderr and "openjdk-17" in res.stderr
    assert "bus.bootstrap_servers" in res.stderr and "Traceback" not in res.stderr


def test_bus_without_a_broker_says_how_to_get_one(tmp_path):
    cfg = Config()
    cfg.broker.state_dir = str(tmp_path)
    with pytest.raises(RetriableError, match="kernelrl broker start.*bus.bootstrap_servers"):
        Bus(cfg)


def test_bench_dispatch_reports_missing_modules(monkeypatch):
    monkeypatch.setitem(cmd_bench.TARGETS, "nothing", "learner.no_such_bench_module")
    with pytest.raises(SetupError, match="not built yet"):
        cmd_bench._load("nothing")


@pytest.mark.parametrize("override, needle", [
    ("bus.compression=brotli", "bus.compression: 'brotli' is not one of"),
    ("bus.auto_offset_reset=middle", "bus.auto_offset_reset: 'middle' is not one of"),
    ("bus.session_timeout_ms=abc", "bus.session_timeout_ms: expected int, got 'abc'"),
    ("bus.heartbeat_interval_ms=20000", "bus.heartbeat_interval_ms: must be < bus.session_timeout_ms"),
    ("topics.reply_partitions=0", "topics.reply_partitions: must be > 0, got 0"),
    ("topics.trajectory_max_message_bytes=1000", "topics.trajectory_max_message_bytes: must be >= 8 MiB"),
    ("topics.compression=brotli", "topics.compression: 'brotli' is not one of"),
    ("broker.port=70000", "broker.port: must be 0..65535, got 70000"),
    ("broker.fast_start=maybe", "broker.fast_start: expected bool, got 'maybe'"),
    ("bus.no_such=1", "bus.no_such: unknown field"),
])
def test_config_errors_name_field_and_value(override, needle):
    with pytest.raises(ConfigError) as err:
        load(overrides=[override], environ={})
    assert needle in str(err.value)


def test_bad_environment_override_is_reported_by_the_cli(tmp_path):
    env = {**os.environ, "KRL__BUS__MAX_POLL_RECORDS": "-3"}
    res = kernelrl("config", "show", env=env)
    assert res.returncode == 2 and "bus.max_poll_records: must be > 0, got -3" in res.stderr


def test_security_settings_are_passed_to_every_client():
    from cluster.bus.clients import admin_kwargs, consumer_kwargs, producer_kwargs

    cfg = load(overrides=["bus.bootstrap_servers=k1:9093,k2:9093", "bus.security_protocol=SASL_SSL",
                          "bus.sasl_mechanism=SCRAM-SHA-512", "bus.sasl_username=u", "bus.sasl_password=p",
                          "bus.ssl_cafile=/ca.pem"], environ={})
    for kw in (producer_kwargs(cfg, "p"), consumer_kwargs(cfg, "c", "g"), admin_kwargs(cfg, "a")):
        assert kw["bootstrap_servers"] == ["k1:9093", "k2:9093"]
        assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
        assert kw["sasl_plain_username"] == "u" and kw["sasl_plain_password"] == "p"
        assert kw["ssl_cafile"] == "/ca.pem"
    prod, cons = producer_kwargs(cfg, "p"), consumer_kwargs(cfg, "c", "g")
    assert prod["acks"] == "all" and prod["enable_idempotence"] is True
    assert prod["max_request_size"] > 16 * 1024 * 1024 and cons["max_partition_fetch_bytes"] > 16 * 1024 * 1024
    assert cons["enable_auto_commit"] is False


def test_bus_finds_the_running_embedded_broker_through_its_state_dir(kafka):
    if not kafka["embedded"]:
        pytest.skip("the suite runs against an external cluster (KRL__BUS__BOOTSTRAP_SERVERS was set)")
    cfg = Config()
    cfg.broker.state_dir = kafka["state_dir"]
    with Bus(cfg) as bus:
        assert bus.bootstrap == kafka["bootstrap"]


@pytest.mark.parametrize("argv, target, json_, requests, rest", [
    (["bench", "bus", "--json"], "bus", True, 500, []),
    (["bench", "bus", "--requests", "50"], "bus", False, 50, []),
    (["bench", "learner", "--steps", "3", "--json"], "learner", True, 500, ["--steps", "3"]),
])
def test_bench_passes_unknown_options_to_the_target(argv, target, json_, requests, rest):
    from cluster.cli import build_parser

    args = build_parser().parse_args(argv)
    cmd_bench._split_rest(args)
    assert (args.target, args.json, args.requests, args.rest) == (target, json_, requests, rest)


def test_bench_help_after_the_target_describes_without_running(monkeypatch, capsys):
    from cluster.cli import main
    from sandbox_workers import bench_compile

    def never(*_a):
        raise AssertionError("--help ran the benchmark")

    monkeypatch.setattr(bench_compile, "run_bench", never)
    assert main(["bench", "compile", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kernelrl bench compile") and bench_compile.__doc__.strip().splitlines()[0] in out


def test_broker_starts_with_a_cluster_id_starting_with_a_dash(kafka, tmp_path, monkeypatch):
    """One random KRaft cluster id in 64 starts with '-': formatting must not read it as an option."""
    from cluster.broker import embedded as broker

    if not kafka["embedded"]:
        pytest.skip("the suite runs against an external cluster: no local Kafka jars to run")
    monkeypatch.setattr(broker, "_cluster_id", lambda: "-dashFirstClusterId0A")
    cfg = Config()
    cfg.broker.state_dir = str(tmp_path / "state")
    try:
        broker.start(cfg, tie_to_parent=True)
        meta = next((tmp_path / "state").rglob("meta.properties")).read_text()
        assert "cluster.id=-dashFirstClusterId0A" in meta
    finally:
        assert broker.stop(cfg, timeout_s=20)["clean"]


def test_kafka_io_loop_warnings_are_quiet_unless_debugging():
    import logging

    from cluster.cli import main

    log = logging.getLogger("kafka.net.selector")
    try:
        main(["config", "show"])
        assert log.level == logging.ERROR
        log.setLevel(logging.NOTSET)
        main(["-vv", "config", "show"])
        assert log.level == logging.NOTSET  # left to the root logger's DEBUG
    finally:
        log.setLevel(logging.NOTSET)
