"""Codec unit tests (no broker): round trips, precise errors, limits, tolerance, fuzzing."""
from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import codec
from schemas.codec import SchemaError
from schemas.messages import (LIMITS, CompileRequest, EvaluateResult, RequestHeader, Task, Trajectory,
                              TurnInfo)
from tests.backbone.samples import all_samples, assert_same, big_trajectory, roundtrip


@pytest.mark.parametrize("kind", sorted(all_samples()))
def test_every_type_round_trips(kind):
    msg = all_samples()[kind]
    assert_same(msg, roundtrip(msg))


def test_wire_form_is_versioned_msgpack_with_raw_arrays():
    traj = big_trajectory(1000)
    body = msgpack.unpackb(codec.encode(traj), raw=False)
    assert body["k"] == "trajectory" and body["v"] == Trajectory.VERSION
    ids = body["d"]["token_ids"]
    assert ids["__nd__"] == ["<i4", [1000]] and isinstance(ids["b"], bytes) and len(ids["b"]) == 4000
    assert ids["b"] == traj.token_ids.astype("<i4").tobytes()


def test_big_endian_and_strided_arrays_are_sent_little_endian():
    ids = np.arange(20, dtype=">i4")[::2]
    traj = Trajectory(episode_id="e", task_id="t", actor_id="a", token_ids=ids)
    back = roundtrip(traj)
    assert back.token_ids.dtype == np.dtype("<i4") and back.token_ids.tolist() == list(range(0, 20, 2))


def test_unknown_fields_are_tolerated():
    body = msgpack.unpackb(codec.encode(Task(task_id="t1", model_py="x")), raw=False)
    body["d"]["added_in_v9"] = {"whatever": [1, 2]}
    body["v"] = 9  # a newer writer that only added fields says version-1 readers understand it
    assert body["r"] == 1
    msg = codec.decode(msgpack.packb(body, use_bin_type=True))
    assert msg == Task(task_id="t1", model_py="x")


@pytest.mark.parametrize("version, reader", [(99, None), (2, 2), (1, 5)])
def test_records_from_a_newer_schema_are_refused(version, reader):
    body = msgpack.unpackb(codec.encode(Task(task_id="t1", model_py="x")), raw=False)
    body["v"] = version
    if reader is None:
        body.pop("r")  # a writer that does not say who can read it: only readers of its own version
    else:
        body["r"] = reader
    with pytest.raises(codec.SchemaError, match="newer than this kernelrl reads"):
        codec.decode(msgpack.packb(body, use_bin_type=True))


def test_records_of_writers_before_reader_versions_still_decode():
    body = msgpack.unpackb(codec.encode(Task(task_id="t1", model_py="x")), raw=False)
    body.pop("r")
    assert codec.decode(msgpack.packb(body, use_bin_type=True)) == Task(task_id="t1", model_py="x")


def _tamper(msg, **fields) -> bytes:
    body = msgpack.unpackb(codec.encode(msg), raw=False)
    body["d"].update(fields)
    return msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize("fields, needle", [
    ({"task_id": 5}, "task.task_id: expected str, got int"),
    ({"level": "high"}, "task.level: expected int, got str"),
    ({"level": True}, "task.level: expected int, got bool"),
    ({"metadata": [1]}, "task.metadata: expected a map, got list"),
    ({"metadata": {1: 2}}, "task.metadata: map key 1 is not a string"),
])
def test_mistyped_fields_name_the_field(fields, needle):
    with pytest.raises(SchemaError) as err:
        codec.decode(_tamper(Task(task_id="t", model_py="m"), **fields))
    assert needle in str(err.value)


def test_missing_required_field_and_nested_errors_are_precise():
    body = msgpack.unpackb(codec.encode(Task(task_id="t", model_py="m")), raw=False)
    del body["d"]["model_py"]
    with pytest.raises(SchemaError, match=r"task: missing required field\(s\) \['model_py'\]"):
        codec.decode(msgpack.packb(body))
    traj = Trajectory(episode_id="e", task_id="t", actor_id="a", turns=[TurnInfo(0, 1, 2)])
    with pytest.raises(SchemaError, match=r"trajectory.turns\[0\].gen_end: expected int, got str"):
        codec.decode(_tamper(traj, turns=[{"start": 0, "gen_start": 1, "gen_end": "2"}]))


def test_encode_rejects_bad_values_with_the_same_precise_errors():
    with pytest.raises(SchemaError, match="task.level: expected int, got str"):
        codec.encode(Task(task_id="t", model_py="m", level="1"))
    with pytest.raises(SchemaError, match=r"compile_request.files.a.cu: expected str, got bytes"):
        codec.encode(CompileRequest(header=RequestHeader(), episode_id="e", files={"a.cu": b"x"}))
    with pytest.raises(SchemaError, match=r"trajectory.turns\[1\]: expected TurnInfo, got dict"):
        codec.encode(Trajectory(episode_id="e", task_id="t", actor_id="a", turns=[TurnInfo(0, 1, 2), {"x": 1}]))
    with pytest.raises(SchemaError, match=r"trajectory.token_ids: array dtype '\|O' not allowed"):
        codec.encode(Trajectory(episode_id="e", task_id="t", actor_id="a", token_ids=np.array([object()])))
    with pytest.raises(SchemaError, match="not a registered message type"):
        codec.encode(TurnInfo(0, 1, 2))


def test_numpy_scalars_are_accepted_for_plain_fields():
    res = EvaluateResult(request_id="r", episode_id="e", task_id="t", compiled=np.bool_(True), correct=True,
                         reward=np.float32(1.5), speedup_vs_eager=np.float64(2.0), timings={"n": np.int64(3)})
    back = roundtrip(res)
    assert back.reward == 1.5 and back.compiled is True and back.timings == {"n": 3}


def test_oversized_fields_are_rejected():
    big = "x" * (LIMITS["max_str_chars"] + 1)
    with pytest.raises(SchemaError, match="task.model_py: string of .* exceeds limit"):
        codec.encode(Task(task_id="t", model_py=big))
    with pytest.raises(SchemaError, match="exceeds max_str_len"):  # msgpack stops it before allocation
        codec.decode(_tamper(Task(task_id="t", model_py="m"), model_py=big))
    too_many = np.zeros(LIMITS["max_array_elems"] + 1, np.uint8)
    with pytest.raises(SchemaError, match="trajectory.loss_mask: array of .* elements exceeds limit"):
        codec.encode(Trajectory(episode_id="e", task_id="t", actor_id="a", loss_mask=too_many))


@pytest.mark.parametrize("nd, needle", [
    ({"__nd__": ["<i4", [3]], "b": b"\x00" * 11}, "array bytes do not match"),
    ({"__nd__": ["|O", [1]], "b": b"\x00" * 8}, "dtype '|O' not allowed"),
    ({"__nd__": ["<i4", [-1]], "b": b""}, "bad array shape"),
    ({"__nd__": ["<i4", [2 ** 40, 2 ** 40]], "b": b""}, "exceeds limit"),
    ({"__nd__": "junk"}, "malformed array"),
    ([1, 2, 3], "expected an array, got list"),
])
def test_malformed_arrays_are_rejected(nd, needle):
    with pytest.raises(SchemaError, match=f"trajectory.token_ids: .*{needle}" if "expected" not in needle
                       else f"trajectory.token_ids: {needle}"):
        codec.decode(_tamper(Trajectory(episode_id="e", task_id="t", actor_id="a"), token_ids=nd))


def test_expected_type_is_enforced():
    data = codec.encode(Task(task_id="t", model_py="m"))
    with pytest.raises(SchemaError, match="expected trajectory, got task"):
        codec.decode(data, expected=Trajectory)


@pytest.mark.parametrize("data, needle", [
    (b"", "undecodable msgpack"),
    (b"\xc1", "undecodable msgpack"),
    (msgpack.packb([1, 2]), "not a kernelrl message"),
    (msgpack.packb({"k": "nope", "v": 1, "d": {}}), "unknown message kind 'nope'"),
    (msgpack.packb({"k": "task", "v": 0, "d": {}}), "bad schema version 0"),
    (msgpack.packb({"k": "task", "v": 1, "d": [1]}), "body must be a map"),
])
def test_garbage_is_a_schema_error(data, needle):
    with pytest.raises(SchemaError, match=needle):
        codec.decode(data)


_valid = [codec.encode(m) for m in all_samples().values()]


@st.composite
def _mutated(draw):
    base = bytearray(draw(st.sampled_from(_valid)))
    for _ in range(draw(st.integers(1, 8))):
        i = draw(st.integers(0, len(base) - 1))
        base[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        base = base[: draw(st.integers(0, len(base)))]
    return bytes(base)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=512), _mutated()))
def test_fuzzed_bytes_raise_only_schema_error(data):
    try:
        msg = codec.decode(data)
    except SchemaError:
        return
    # a mutation that still decodes must be a well-formed message that re-encodes
    assert dataclasses.is_dataclass(msg)
    codec.encode(msg)


def test_filter_request_and_result_round_trip_with_precise_errors():
    from schemas.messages import FAULT_POLICY, FilterRequest, FilterResult

    req = FilterRequest(header=RequestHeader(reply_topic="r", deadline_ms=5), source="class Model: ...",
                        filter={"backend": "cpu", "min_ms": 0.002, "check_compile": True}, timeout_s=60)
    back = codec.decode(codec.encode(req), expected=FilterRequest)
    assert back == req and back.header.deadline_ms == 5
    assert FilterRequest(header=RequestHeader(), source="m").timeout_s == 120.0  # the defaults
    verdict = {"ok": False, "rule": "finite", "reason": "nan in output", "eager_ms": 0.5, "compile_ms": 0.25,
               "output_shape": [128, 256], "duration_s": 1.5}
    res = FilterResult(request_id="r1", ok=False, rule="finite", reason="nan in output", eager_ms=0.5,
                       compile_ms=0.25, duration_s=1.5, verdict=verdict, worker="eval-cpu@h:1", fault=FAULT_POLICY)
    assert codec.decode(codec.encode(res), expected=FilterResult) == res
    body = msgpack.unpackb(codec.encode(req), raw=False)
    assert body["k"] == "filter_request" and body["v"] == FilterRequest.VERSION == 1
    with pytest.raises(SchemaError, match=r"filter_request.timeout_s: expected float, got str"):
        codec.decode(msgpack.packb({**body, "d": {**body["d"], "timeout_s": "soon"}}))
    with pytest.raises(SchemaError, match=r"missing required field\(s\) \['source'\]"):
        codec.decode(msgpack.packb({**body, "d": {k: v for k, v in body["d"].items() if k != "source"}}))
    with pytest.raises(SchemaError, match="expected filter_result, got filter_request"):
        codec.decode(codec.encode(req), expected=FilterResult)
