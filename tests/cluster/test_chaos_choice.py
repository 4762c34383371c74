"""The chaos schedule: each role once by default, every ~S seconds with repeat, the broker only with --broker,
and the same seed picks the same victims (a failing chaos run can be replayed)."""
from __future__ import annotations

from types import SimpleNamespace

from cluster.launch.run_loop import _Chaos


class FakeSup:
    def __init__(self, names):
        self.roles = {n: SimpleNamespace(alive=True, kills=0) for n in names}
        self.killed = []

    def kill(self, name):
        self.roles[name].kills += 1
        self.killed.append(name)


class FakeBroker:
    owned = True

    def __init__(self):
        self.kills = 0

    def alive(self):
        return True

    def kill(self):
        self.kills += 1


def _run(chaos, sup, ticks=12):
    for _ in range(ticks):
        chaos.next = 0.0  # due now
        chaos.tick(sup)


def test_each_role_once_and_the_broker_only_when_asked():
    sup = FakeSup(["a", "b", "c"])
    _run(_Chaos(1.0, seed=7), sup)
    assert sorted(sup.killed) == ["a", "b", "c"]
    sup2, broker = FakeSup(["a", "b"]), FakeBroker()
    _run(_Chaos(1.0, seed=7, broker_watch=broker), sup2)
    assert sorted(sup2.killed) == ["a", "b"] and broker.kills == 1


def test_repeat_keeps_killing_and_a_seed_replays_the_victims():
    first, again = FakeSup(["a", "b", "c"]), FakeSup(["a", "b", "c"])
    _run(_Chaos(1.0, seed=42, repeat=True), first, ticks=30)
    _run(_Chaos(1.0, seed=42, repeat=True), again, ticks=30)
    assert len(first.killed) == 30 and first.killed == again.killed
    drawn = {_Chaos(1.0, seed=None).seed for _ in range(5)}  # without --chaos-seed a fresh seed, reported
    assert len(drawn) > 1 and all(isinstance(x, int) for x in drawn)
