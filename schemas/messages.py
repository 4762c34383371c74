"""Versioned message types that travel on the bus.

Each type is a dataclass with a wire ``KIND`` and ``VERSION``. Numeric arrays
are ``numpy.ndarray`` fields (sent as raw little-endian bytes with dtype and
shape); nested types are dataclasses too. Field limits live in ``LIMITS`` and
are checked by the codec on both encode and decode.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def new_id() -> str:
    return uuid.uuid4().hex


def now_ms() -> int:
    return int(time.time() * 1000)


# Who a tool result's failure is due to (CompileResult.fault, EvaluateResult.fault). A policy's
# failure is its reward; an infrastructure fault is never a reward: the actor retries the call and,
# if it keeps failing, marks the episode's reward undetermined (Trajectory.reward_status).
FAULT_NONE = "none"  # success: nothing failed
FAULT_POLICY = "policy"  # the candidate's own doing: compile error, violation, wrong output, its crash/timeout
FAULT_INFRA = "infra"  # the infrastructure's: worker exception, reference/baseline failure, GPU health,
# sandbox or toolchain unavailable, lost reply, the worker's own deadline
FAULTS = (FAULT_NONE, FAULT_POLICY, FAULT_INFRA)

# Trajectory.reward_status values.
REWARD_OK = "ok"
REWARD_UNDETERMINED = "undetermined"  # an infrastructure fault kept the reward from being measured

# The oracle's reward of a failed episode (not compiled, or wrong): the floor of the milestone reward
# (REFERENCE.md section 1; sandbox_workers/reward.py), and the baseline of learner.advantage = "floor".
FAIL_REWARD = -1.0

# evaluators before the fault field said a reference failure only in the error text
REFERENCE_FAILED_PREFIX = "reference run failed"


def _i32(values=()) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def _f32(values=()) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


@dataclass
class Task:
    """One problem to roll out: a KernelBench-style reference `model.py`."""

    KIND = "task"
    VERSION = 1
    task_id: str
    model_py: str
    backend: str = "cpu"  # cpu | cuda
    level: int = 0
    name: str = ""
    source: str = ""  # where it came from: kernelbench, synth, ...
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestHeader:
    """What makes a message a request: who asked, where to answer, until when."""

    request_id: str = field(default_factory=new_id)
    reply_topic: str = ""
    reply_partition: int = 0
    deadline_ms: int = 0  # absolute unix ms; 0 = none
    attempt: int = 0
    sender: str = ""


@dataclass
class CompileRequest:
    """Build a workspace (sources by relative path) into an importable extension."""

    KIND = "compile_request"
    VERSION = 1
    header: RequestHeader
    episode_id: str
    files: dict[str, str]  # relative path -> source text (model_new.py, kernels/*.cu|*.cpp)
    backend: str = "cpu"  # cpu | cuda
    cuda_arch: str = ""
    extra_flags: list[str] = field(default_factory=list)
    # False: the reply leaves out the library's bytes (CompileResult.artifact); the actor needs only its key.
    # Older compile workers ignore the field and inline them anyway (harmless)
    inline_artifact: bool = True


@dataclass
class CompileResult:
    KIND = "compile_result"
    VERSION = 1
    request_id: str
    episode_id: str
    ok: bool
    artifact_key: str = ""  # content hash; the artifact lives in the shared artifact cache
    artifact_uri: str = ""  # where a worker on another host fetches it (file:// or s3://)
    artifact: bytes = b""  # the built module itself, when small enough to inline
    cached: bool = False
    log: str = ""  # truncated compiler output for the agent
    error: str = ""
    duration_s: float = 0.0
    worker: str = ""
    # FAULT_NONE | FAULT_POLICY | FAULT_INFRA; "" = not stated (a sender older than this field: see fault_of)
    fault: str = ""
    violations: list[str] = field(default_factory=list)  # the kernel rules a failed build broke (older senders: [])


@dataclass
class EvaluateRequest:
    """Verify and/or profile a compiled solution against its task."""

    KIND = "evaluate_request"
    VERSION = 1
    header: RequestHeader
    episode_id: str
    task_id: str
    model_py: str
    files: dict[str, str]
    # the artifact's content key; the evaluation worker computes its own from ``files`` and takes the artifact from
    # its cache or the compile workers. ``artifact``: the bytes inline, as older actors sent them (now left empty)
    artifact_key: str = ""
    artifact_uri: str = ""
    artifact: bytes = b""
    # verify | profile | both; "filter" (model_py a candidate task, options {"filter": {...}, "timeout_s"}) is the
    # pre-FilterRequest way to ask for the task filter: still answered for older senders, no longer sent
    mode: str = "both"
    backend: str = "cpu"
    options: dict[str, Any] = field(default_factory=dict)  # mode-specific


@dataclass
class EvaluateResult:
    KIND = "evaluate_result"
    VERSION = 1
    request_id: str
    episode_id: str
    task_id: str
    compiled: bool
    correct: bool
    reward: float
    speedup_vs_eager: float = 0.0
    speedup_vs_compile: float = 0.0
    violations: list[str] = field(default_factory=list)
    error: str = ""
    timings: dict[str, Any] = field(default_factory=dict)  # raw numbers: median/mean/stdev/n per variant
    evidence: dict[str, Any] = field(default_factory=dict)  # correctness details, device, clocks, versions
    duration_s: float = 0.0
    worker: str = ""
    # FAULT_NONE | FAULT_POLICY | FAULT_INFRA; "" = not stated (a sender older than this field: see fault_of).
    # With FAULT_INFRA, reward means nothing (0.0): no reward could be measured.
    fault: str = ""


@dataclass
class FilterRequest:
    """Check a candidate task (`tasks synthesize|verify --via bus`): is it fit to train on?

    Sent on the evaluate topic of the filter's backend (``filter["backend"]``); the evaluation
    worker runs the task execution filter (cluster.tasks.filter) on it in a sandboxed child.
    """

    KIND = "filter_request"
    VERSION = 1
    header: RequestHeader
    source: str  # the candidate task's model.py
    filter: dict[str, Any] = field(default_factory=dict)  # FilterConfig.to_dict(); backend says the device kind
    timeout_s: float = 120.0  # for the check itself (a worker's first check also pays its child's start)


@dataclass
class FilterResult:
    """The filter's verdict on one FilterRequest.

    ``fault``: FAULT_NONE (passed), FAULT_POLICY (the task failed a rule: ``rule``/``reason`` say
    which) or FAULT_INFRA (no verdict: an invalid request, a wrong backend, a worker failure; ``rule``
    is then "invalid_request" or "worker_error" and ``verdict`` is empty).
    """

    KIND = "filter_result"
    VERSION = 1
    request_id: str
    ok: bool
    rule: str = ""  # the first rule that failed ("" when ok)
    reason: str = ""
    eager_ms: float = 0.0
    compile_ms: float = 0.0
    duration_s: float = 0.0
    verdict: dict[str, Any] = field(default_factory=dict)  # the whole Verdict (cluster.tasks.filter) as a dict
    worker: str = ""
    fault: str = ""


def fault_of(res: Any) -> str:
    """The fault of a CompileResult / EvaluateResult: its ``fault`` field, or inferred for an older sender.

    Infrastructure wins: ``evidence["infra"]`` or a failed reference run is FAULT_INFRA whatever the
    field says. An unstated fault on a failed result without a worker name is an error reply built
    by the bus's serve loop (a handler exception), so the infrastructure's too.
    """
    fault = getattr(res, "fault", "") or ""
    evidence = getattr(res, "evidence", None) or {}
    error = getattr(res, "error", "") or ""
    if fault == FAULT_INFRA or evidence.get("infra") or error.startswith(REFERENCE_FAILED_PREFIX):
        return FAULT_INFRA
    if fault in FAULTS:
        return fault
    ok = res.ok if hasattr(res, "ok") else (getattr(res, "compiled", False) and getattr(res, "correct", False)
                                            and not getattr(res, "violations", None))
    if ok:
        return FAULT_NONE
    return FAULT_INFRA if not getattr(res, "worker", "") and error else FAULT_POLICY


@dataclass
class TurnInfo:
    """One assistant turn inside a trajectory's flat token stream."""

    start: int  # index of the first token of the turn (prompt/observation included)
    gen_start: int  # first generated token
    gen_end: int  # one past the last generated token
    tool_name: str = ""
    tool_latency_s: float = 0.0
    malformed_tool_call: bool = False
    repeated_action: bool = False


@dataclass
class Trajectory:
    """A finished episode, token in token out: what the engine produced, exactly."""

    KIND = "trajectory"
    VERSION = 1
    episode_id: str
    task_id: str
    actor_id: str
    token_ids: np.ndarray = field(default_factory=_i32)  # int32 [T]
    logprobs: np.ndarray = field(default_factory=_f32)  # float32 [T], behaviour log-probs (0 where mask=0)
    loss_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))  # uint8 [T], 1 = generated
    policy_version: np.ndarray = field(default_factory=_i32)  # int32 [T], -1 where not generated
    prompt_len: int = 0
    turns: list[TurnInfo] = field(default_factory=list)
    reward: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)
    end_reason: str = ""  # finish | turn_cap | context_cap | error
    mode: str = "multi_turn"
    has_logprobs: bool = True
    created_ms: int = field(default_factory=now_ms)
    metadata: dict[str, Any] = field(default_factory=dict)
    # REWARD_OK | REWARD_UNDETERMINED: an infrastructure fault kept the reward from being measured
    # (reward is then NaN and evidence["undetermined"] says why); the learner skips such episodes
    reward_status: str = REWARD_OK

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class WeightAnnouncement:
    """A new policy version is complete and may be applied."""

    KIND = "weight_announcement"
    VERSION = 3  # 2 added layout, buckets, bucket_bytes (their defaults keep a version-1 record's meaning);
    # 3 added digest (its default, "sha256", keeps an older record's meaning)
    MIN_READER = 1  # a version-1 reader drops them and refuses a "buckets" version: its chunks match no ``files``;
    # a reader older than 3 drops ``digest``, checks a blake3 version's hashes as sha256 and rejects it as corrupt:
    # it fails closed (its engine stays on the version it has), so older readers may still read the record
    model_name: str
    version: int
    transport: str  # kafka | fs | nccl
    uri: str = ""  # fs: folder; kafka: topic name of the chunks
    num_chunks: int = 0
    total_bytes: int = 0
    # Every hash here and in the version's WeightChunks is of ``digest``'s algorithm (cluster.weights.digest:
    # "blake3" for new versions, "sha256" for older ones); the fields keep their sha256 names. A blake3 "buckets"
    # version's chunks carry no hash (""): each bucket is checked whole against ``buckets``.
    sha256: str = ""  # version digest: ``digest`` of "<name> <file digest>\n" lines in name order
    files: dict[str, str] = field(default_factory=dict)  # file name -> ``digest`` of its bytes
    step: int = 0
    created_ms: int = field(default_factory=now_ms)
    # "files": a Hugging Face folder (above). "buckets": an ordered list of in-memory buckets (each the
    # safetensors serialisation of some of the policy's tensors, chunk file name "bucket-<i>"), loaded
    # straight into the engine; ``files`` is empty and ``sha256`` covers the "bucket-<i> <digest>" lines.
    layout: str = "files"
    buckets: list[str] = field(default_factory=list)  # ``digest`` of each bucket's bytes, in order
    bucket_bytes: list[int] = field(default_factory=list)  # each bucket's size in bytes
    # Optional delta section of a "buckets" version (learner.weight_compression "xor-delta";
    # cluster.weights.codec): besides its full buckets, bucket i encoded against bucket i of version
    # delta_base[i] (-1: carried whole), as chunks "delta-<i>" keyed "<model>:<version>:delta" at delta_uri.
    # A receiver that holds that base may read these instead; what it decodes must match buckets[i]. The full
    # buckets are always there, so a reader that drops these fields reads the version as before: VERSION and
    # MIN_READER stay. delta_codec is set (and the section may be empty) whenever the learner encodes deltas:
    # it tells receivers to keep this version's buckets, the base of the next one.
    delta_codec: str = ""
    delta_uri: str = ""
    delta_chunks: int = 0
    delta_base: list[int] = field(default_factory=list)
    delta_bytes: list[int] = field(default_factory=list)  # each delta entry's size on the wire
    digest: str = "sha256"  # the algorithm of every hash above and of the chunks' (blake3 | sha256)


@dataclass
class WeightChunk:
    """One bucket of a safetensors file's bytes."""

    KIND = "weight_chunk"
    VERSION = 1
    model_name: str
    version: int
    index: int
    count: int
    file_name: str
    offset: int
    data: bytes
    sha256: str  # of ``data``, by the algorithm its announcement's ``digest`` names


@dataclass
class DeadLetter:
    """A message a consumer could not decode or validate, kept with the reason."""

    KIND = "dead_letter"
    VERSION = 1
    source_topic: str
    partition: int
    offset: int
    error: str
    payload: bytes = b""
    key: bytes = b""
    consumer: str = ""
    created_ms: int = field(default_factory=now_ms)


@dataclass
class TrainStep:
    """The learner's durable step log: published after the step's checkpoint is saved,
    so the set of trained episode ids read back from it is exactly what the model saw."""

    KIND = "train_step"
    VERSION = 1
    step: int
    policy_version: int
    stage: str
    episode_ids: list[str]
    metrics: dict[str, Any] = field(default_factory=dict)
    dropped_stale: list[str] = field(default_factory=list)
    created_ms: int = field(default_factory=now_ms)


MESSAGE_TYPES: dict[str, type] = {
    t.KIND: t
    for t in (Task, CompileRequest, CompileResult, EvaluateRequest, EvaluateResult, FilterRequest, FilterResult,
              Trajectory, WeightAnnouncement, WeightChunk, DeadLetter, TrainStep)
}

# Upper bounds checked by the codec: anything larger is rejected with a precise error.
LIMITS = {
    "max_str_chars": 4 * 1024 * 1024,
    "max_bytes": 64 * 1024 * 1024,
    "max_array_elems": 4 * 1024 * 1024,
    "max_list_items": 100_000,
    "max_files": 512,
}

__all__ = [
    "Task", "RequestHeader", "CompileRequest", "CompileResult", "EvaluateRequest", "EvaluateResult",
    "FilterRequest", "FilterResult", "TurnInfo", "Trajectory", "WeightAnnouncement", "WeightChunk", "DeadLetter", "TrainStep", "MESSAGE_TYPES",
    "LIMITS", "new_id", "now_ms", "FAULT_NONE", "FAULT_POLICY", "FAULT_INFRA", "FAULTS", "fault_of", "REWARD_OK", "FAIL_REWARD",
    "REWARD_UNDETERMINED", "REFERENCE_FAILED_PREFIX",
]
