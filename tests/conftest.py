"""Shared fixtures: one real embedded Kafka broker per test session, and per-test configs.

- ``kafka`` (session): starts the embedded broker once (temp state dir, free loopback
  ports) and stops it at the end; exports ``KRL__BUS__BOOTSTRAP_SERVERS`` so role
  subprocesses find it. With KRL__BUS__BOOTSTRAP_SERVERS already set, that cluster is
  used instead and nothing is started.
- ``cfg``: a Config pointing at it with a unique topic prefix per test, topics created
  (small partition counts; ``make_cfg(**overrides)`` builds more), deleted afterwards.
- ``cfg_env(cfg)``: environment for a subprocess so ``load()`` there gives the same config.
- ``spawn``: start ``kernelrl ...`` (or ``python -m ...``) subprocesses; killed at teardown.
"""
from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count()


def _shared_cache() -> Path:
    """Compiled caches every test of every session may share: torch's precompiled headers and inductor's
    compiled baselines (each keyed by torch's version and the flags; a minute of g++ or tens of seconds of
    inductor per fresh cache, which most sandbox tests make: their own artifacts and baselines stay per test)."""
    from cluster.config import Config

    root = Path(os.environ.get("KRL_TEST_SHARED_CACHE") or Path(Config().broker.cache_dir).expanduser() / "test-shared")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)  # as the worker keeps its own caches' parents: no sandbox user may walk into them
    return root


SHARED_CACHE = _shared_cache()
SHARED_SANDBOX = {"pch_cache_dir": str(SHARED_CACHE / "pch"), "inductor_cache_dir": str(SHARED_CACHE / "inductor")}

# Small and quick for tests; a test may override anything through make_cfg.
TEST_OVERRIDES = {
    **{f"sandbox.{k}": v for k, v in SHARED_SANDBOX.items()},
    "topics.partitions": 2,
    "topics.tool_partitions": 2,
    "topics.reply_partitions": 8,
    "bus.session_timeout_ms": 3000,
    "bus.heartbeat_interval_ms": 300,
    "bus.request_timeout_s": 10.0,
    "bus.retry_backoff_s": 0.1,
}


@pytest.fixture(scope="session")
def kafka():
    """The session's broker: {'bootstrap', 'state_dir', 'embedded'}."""
    from cluster.broker import embedded as broker
    from cluster.config import Config

    external = os.environ.get("KRL__BUS__BOOTSTRAP_SERVERS", "")
    if external:
        yield {"bootstrap": external, "state_dir": None, "embedded": False}
        return
    cfg = Config()
    # outside pytest's basetemp: concurrent pytest sessions prune each other's old basetemps. In memory when
    # it can be: the KRaft controller fsyncs its metadata log on every write, and on a 2-core CI disk busy with
    # writeback one such write took 43 s ("Exceptionally slow controller event writeNoOpRecord"), long enough for
    # every client of the session to time out (tests/actors/test_weights_in_memory.py failed so, 2026-12-04)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    cfg.broker.state_dir = tempfile.mkdtemp(prefix="krl-test-kafka-", dir=shm)
    cfg.broker.heap_mb = 512
    st = broker.start(cfg, tie_to_parent=True)  # no orphan JVM even if pytest is killed
    os.environ["KRL__BUS__BOOTSTRAP_SERVERS"] = st["bootstrap"]
    try:
        yield {"bootstrap": st["bootstrap"], "state_dir": cfg.broker.state_dir, "embedded": True}
    finally:
        os.environ.pop("KRL__BUS__BOOTSTRAP_SERVERS", None)
        res = broker.stop(cfg, timeout_s=20)
        if not res["was_running"]:
            log = Path(cfg.broker.state_dir, "broker.log").read_text(errors="replace")[-3000:]
            print(f"WARNING: the session's Kafka broker had died before teardown; log tail:\n{log}",
                  file=sys.stderr)
        shutil.rmtree(cfg.broker.state_dir, ignore_errors=True)


def _apply(cfg, overrides: dict) -> None:
    from cluster.config import set_value, validate

    for path, value in overrides.items():
        set_value(cfg, path, value)
    validate(cfg)


@pytest.fixture
def make_cfg(kafka, request):
    """Factory: a fresh Config on the session broker with its own topic prefix and topics."""
    from cluster.bus import topics_admin
    from cluster.config import Config

    made = []

    def make(create_topics: bool = True, **overrides):
        cfg = Config()
        name = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name)[:40].strip("-")
        overrides = {**TEST_OVERRIDES, **{k.replace("__", "."): v for k, v in overrides.items()}}
        _apply(cfg, overrides)
        cfg.bus.bootstrap_servers = kafka["bootstrap"]
        cfg.bus.topic_prefix = f"t{os.getpid()}-{next(_counter)}-{name}."
        if create_topics:
            topics_admin.create_all(cfg)
        made.append(cfg)
        return cfg

    yield make
    for cfg in made:
        try:
            topics_admin.delete_prefix(cfg)
        except Exception as exc:  # noqa: BLE001 - cleanup must not fail the test
            print(f"topic cleanup for {cfg.bus.topic_prefix}: {exc}", file=sys.stderr)


@pytest.fixture
def cfg(make_cfg):
    """A Config on the session broker with a unique topic prefix; kernelrl's topics exist."""
    return make_cfg()


def cfg_env(cfg, base: dict | None = None) -> dict:
    """Environment under which ``cluster.config.load()`` reproduces ``cfg`` (bus/topics/broker)."""
    from cluster.config import Config

    env = dict(os.environ if base is None else base)
    default = Config()
    for section in ("broker", "bus", "topics", "sandbox", "actor", "learner", "cluster"):
        have, dflt = getattr(cfg, section), getattr(default, section)
        for f in dataclasses.fields(have):
            value = getattr(have, f.name)
            if value != getattr(dflt, f.name):
                env[f"KRL__{section.upper()}__{f.name.upper()}"] = str(value)
    env.setdefault("PYTHONPATH", str(ROOT))
    return env


@pytest.fixture
def spawn():
    """Start subprocesses (``spawn(args, env=...)``); whatever still runs at teardown is killed."""
    procs: list[subprocess.Popen] = []

    def start(args: list[str], env: dict | None = None, **kw) -> subprocess.Popen:
        p = subprocess.Popen(args, env=env, cwd=ROOT, start_new_session=True, **kw)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)


KERNELRL = [sys.executable, "-m", "cluster.cli"]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The tiny local model and tokenizer (built once per session, or reused from $KERNELRL_TEST_TINY_MODEL)."""
    from cluster.models.tiny import build_tiny_model

    cache = os.environ.get("KERNELRL_TEST_TINY_MODEL")
    return build_tiny_model(cache or tmp_path_factory.mktemp("tiny") / "model")
