"""The evaluator's pool of pre-started candidate sessions: the oldest live one serves the job, dead ones are
dropped, the pool is topped up to `sandbox.warm_pool`, and close() stops every one (pure logic: the sessions are
stand-ins; the real ones run in every evaluation of the CUDA suite, docs/oracle-gpu.md session 9)."""
from __future__ import annotations

import copy
import itertools

import pytest

from sandbox_workers import evaluator as ev_mod

_ids = itertools.count()


class FakeSession:
    def __init__(self, cfg, backend, role, inductor_cache=None, profile=False):
        self.id, self.role, self.started, self.closed, self.dead = next(_ids), role, False, False, False

    def start(self):
        self.started = True
        return self

    def alive(self):
        return self.started and not self.dead and not self.closed

    def close(self):
        self.closed = True


@pytest.fixture
def ev(sb_cfg, monkeypatch, tmp_path):
    monkeypatch.setattr(ev_mod, "Session", FakeSession)
    monkeypatch.setattr(ev_mod.cpuset, "available", lambda: list(range(16)))  # a host big enough for a pool
    cfg = copy.deepcopy(sb_cfg)
    cfg.sandbox.isolation = "none"
    cfg.sandbox.baseline_cache_dir = str(tmp_path / "baselines")
    cfg.sandbox.warm_sessions, cfg.sandbox.warm_pool = True, 3
    return ev_mod.Evaluator(cfg, "cuda", device_key="cuda:test")  # no GPU is touched: the sessions are stand-ins


def test_pool_serves_oldest_live_session_and_refills(ev):
    first = ev._take("candidate")
    assert first.started and len(ev._ready["candidate"]) == 3
    pool = list(ev._ready["candidate"])
    assert all(s.started for s in pool)
    pool[0].dead = True  # a pre-started pair that died while waiting
    second = ev._take("candidate")
    assert second is pool[1] and pool[0].closed  # the dead one is closed, never handed out
    waiting = list(ev._ready["candidate"])
    assert len(waiting) == 3 and pool[2] in waiting
    ev.close()  # the sessions handed out are their jobs' to close; the waiting ones are the evaluator's
    assert all(s.closed for s in waiting) and not second.closed and ev._ready == {}


def test_cpu_keeps_one_pair_ready(ev):
    ev.backend = "cpu"  # pre-started pairs would share the timed job's cores
    ev._take("candidate")
    assert len(ev._ready["candidate"]) == 1


def test_no_pool_for_baselines_or_when_disabled(ev):
    ev._take("baseline")
    assert ev._ready.get("baseline") == []
    ev.sb.warm_sessions = False
    ev._take("candidate")
    assert ev._ready.get("candidate") == []
