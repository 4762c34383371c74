"""Malformed records for the input topics of a running loop (tasks, trajectories, weights), and the check that
each one was dead-lettered with its reason or is still unconsumed: the drill of issue 17, part 6.

Shape faults (random bytes, the wrong kind, a missing field, schema versions 0 and 99) are caught by the bus's
decoder; meaning faults (a task no episode can start, a trajectory whose arrays disagree or whose token ids are
outside the vocabulary, an announcement of weights that are nowhere) by the role that consumes them.
"""
from __future__ import annotations

import dataclasses

import msgpack
import numpy as np

from schemas import codec
from schemas import topics as T
from schemas.messages import Task, Trajectory, WeightAnnouncement


def _shape_faults(valid: bytes, required: str, other_kind: bytes) -> dict[str, bytes]:
    body = msgpack.unpackb(valid, raw=False)
    future = dict(body, v=99)
    future.pop("r", None)

    def raw(b):
        return msgpack.packb(b, use_bin_type=True)

    return {"random bytes": b"\x93\xff\x00garbage",
            "wrong kind": other_kind,
            "missing field": raw(dict(body, d={k: v for k, v in body["d"].items() if k != required})),
            "version 0": raw(dict(body, v=0)),
            "version 99": raw(future)}


def _trajectory(eid: str, **over) -> Trajectory:
    n = 8
    fields = dict(episode_id=eid, task_id=f"poison-{eid}", actor_id="drill", token_ids=np.arange(n, dtype=np.int32),
                  logprobs=np.zeros(n, np.float32), loss_mask=np.array([0, 0, 0, 1, 1, 1, 1, 1], np.uint8),
                  policy_version=np.zeros(n, np.int32), reward=1.0)
    fields.update(over)
    return Trajectory(**fields)


def poison_by_topic(model_name: str, model_py: str) -> dict[str, dict[str, bytes]]:
    """topic -> fault name -> record bytes."""
    task = codec.encode(Task(task_id="poison-task", model_py=model_py, backend="cpu", name="poison"))
    ann = WeightAnnouncement(model_name=model_name, version=10**6, transport="kafka",
                             uri=f"kafka://{T.WEIGHTS_CHUNKS}/0@999999999", num_chunks=1, total_bytes=1,
                             sha256="0" * 64, files={"model.safetensors": "0" * 64})
    traj = codec.encode(_trajectory("poison-shape"))
    return {
        T.TASKS: {**_shape_faults(task, "model_py", traj),
                  "unknown backend": codec.encode(Task(task_id="poison-backend", model_py=model_py,
                                                       backend="quantum")),
                  "no reference model": codec.encode(Task(task_id="poison-model", model_py="import torch\n"))},
        T.TRAJECTORIES: {**_shape_faults(traj, "token_ids", task),
                         "arrays disagree": codec.encode(_trajectory("poison-arrays",
                                                                     logprobs=np.zeros(3, np.float32))),
                         "ids outside the vocabulary": codec.encode(_trajectory(
                             "poison-vocab", token_ids=np.full(8, 2**30, np.int32)))},
        # a version of its own, or the follower would take the two for one announcement
        T.WEIGHTS: {**_shape_faults(codec.encode(dataclasses.replace(ann, version=10**6 + 1)), "uri", task),
                    "weights that are nowhere": codec.encode(ann)},
    }


def inject(bus, model_name: str, model_py: str) -> list[dict]:
    """Produce every fault onto partition 0 of its topic; returns where each landed."""
    out = []
    prod = bus.producer()
    try:
        for topic, faults in poison_by_topic(model_name, model_py).items():
            for name, payload in faults.items():
                md = prod.send_bytes(topic, payload, key="poison", partition=0).get(30)
                out.append({"topic": topic, "partition": 0, "offset": md.offset, "fault": name})
    finally:
        prod.close()
    return out


def unaccounted(bus, injected: list[dict], groups: dict[str, str]) -> tuple[list[dict], dict]:
    """The injected records that a consumer group moved past without a dead letter (lost), and the letters'
    reasons by (topic, fault). ``groups``: topic -> the group whose commit says "consumed" (weights: none,
    every actor reads them in a group of its own, so a letter is required)."""
    from cluster.bus.scan import committed_offsets, read_topic
    from schemas.messages import DeadLetter

    letters: dict[tuple[str, int], list[str]] = {}
    for rec in read_topic(bus, T.DLQ):
        if isinstance(rec.msg, DeadLetter):
            letters.setdefault((rec.msg.source_topic, rec.msg.offset), []).append(rec.msg.error)
    committed = {t: committed_offsets(bus, bus.group(g), t).get(0, 0) for t, g in groups.items()}
    lost, why = [], {}
    for r in injected:
        got = letters.get((bus.topic(r["topic"]), r["offset"]))
        if got:
            why[(r["topic"], r["fault"])] = got
        elif r["topic"] not in groups or r["offset"] < committed[r["topic"]]:
            lost.append(r)
    return lost, why
