"""Reward provenance on the wire: the fault and reward_status fields round-trip, and messages
written before the fields existed still decode (with the defaults), their fault inferred."""
from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest

from cluster.bus.serve import default_error_reply
from schemas import codec
from schemas.messages import (FAULT_INFRA, FAULT_NONE, FAULT_POLICY, REWARD_OK, REWARD_UNDETERMINED, CompileRequest,
                              CompileResult, EvaluateRequest, EvaluateResult, RequestHeader, Trajectory, fault_of)


def _eval(**kw) -> EvaluateResult:
    base = dict(request_id="r1", episode_id="e1", task_id="t1", compiled=True, correct=False, reward=-1.0,
                worker="eval-cpu@h:1")
    return EvaluateResult(**{**base, **kw})


def _without(msg, *names) -> bytes:
    """The message as a sender from before ``names`` existed wrote it (same kind and version)."""
    body = msgpack.unpackb(codec.encode(msg), raw=False)
    for n in names:
        del body["d"][n]
    return msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize("fault", [FAULT_NONE, FAULT_POLICY, FAULT_INFRA])
def test_fault_round_trips(fault):
    res = codec.decode(codec.encode(_eval(fault=fault)), expected=EvaluateResult)
    assert res.fault == fault and fault_of(res) == fault
    comp = CompileResult(request_id="r", episode_id="e", ok=fault == FAULT_NONE, fault=fault, worker="compile@h:1")
    back = codec.decode(codec.encode(comp), expected=CompileResult)
    assert back.fault == fault and fault_of(back) == fault


def test_undetermined_trajectory_round_trips_with_nan_reward():
    traj = Trajectory(episode_id="e", task_id="t", actor_id="a", token_ids=np.arange(5, dtype=np.int32),
                      reward=math.nan, reward_status=REWARD_UNDETERMINED, evidence={"undetermined": "lost"})
    back = codec.decode(codec.encode(traj), expected=Trajectory)
    assert back.reward_status == REWARD_UNDETERMINED and math.isnan(back.reward)
    assert Trajectory(episode_id="e", task_id="t", actor_id="a").reward_status == REWARD_OK


def test_messages_from_before_the_fields_decode_with_defaults():
    traj = Trajectory(episode_id="e", task_id="t", actor_id="a", token_ids=np.arange(5, dtype=np.int32), reward=2.0)
    old = codec.decode(_without(traj, "reward_status"), expected=Trajectory)
    assert old.reward_status == REWARD_OK and old.reward == 2.0
    assert msgpack.unpackb(_without(traj, "reward_status"), raw=False)["v"] == Trajectory.VERSION == 1

    # an old evaluation result: the fault is inferred from what it did say
    ok = codec.decode(_without(_eval(correct=True, reward=1.0), "fault"), expected=EvaluateResult)
    assert ok.fault == "" and fault_of(ok) == FAULT_NONE
    wrong = codec.decode(_without(_eval(error="mismatch"), "fault"), expected=EvaluateResult)
    assert fault_of(wrong) == FAULT_POLICY
    ref = _eval(error="reference run failed (task problem, not the solution): child died")
    assert fault_of(codec.decode(_without(ref, "fault"), expected=EvaluateResult)) == FAULT_INFRA
    comp = CompileResult(request_id="r", episode_id="e", ok=False, error="compilation failed", worker="compile@h:1")
    assert fault_of(codec.decode(_without(comp, "fault"), expected=CompileResult)) == FAULT_POLICY


def test_infrastructure_signs_override_the_stated_fault():
    assert fault_of(_eval(fault=FAULT_POLICY, evidence={"infra": True})) == FAULT_INFRA
    assert fault_of(_eval(fault=FAULT_NONE, error="reference run failed (task problem, not the solution)")) \
        == FAULT_INFRA


def test_serve_loop_error_replies_are_the_infrastructures():
    """serve() answers a handler exception with a result naming no worker: never the policy's failure."""
    exc = RuntimeError("worker lost its GPU")
    ereq = EvaluateRequest(header=RequestHeader(), episode_id="e", task_id="t", model_py="m", files={})
    creq = CompileRequest(header=RequestHeader(), episode_id="e", files={})
    for req in (ereq, creq):
        reply = codec.decode(codec.encode(default_error_reply(req, exc)))
        assert fault_of(reply) == FAULT_INFRA
