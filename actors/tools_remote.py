"""compile / verify / profile: the agent's remote tools, as requests over the bus.

Each call sends the workspace's solution files to the compile workers, then
(verify, profile) the files and the built artifact's content key (not its bytes:
the evaluation worker takes the artifact from its cache or the compile workers)
to the evaluation workers of the task's device kind, and turns the reply, a timeout or an error into text the model
reads. Every evaluation is kept: the episode's reward comes from them.

Reward provenance: a reply whose fault is the infrastructure's (schemas.fault_of:
worker exception, reference failure, missing toolchain, ...) is no verdict on the
candidate. It is retried (``infra_retries`` times, exponential backoff, a fresh
request id each time); a lost reply (the client's own timeout retries spent) and
a non-retriable transport error end the call at once. A call that still fails is
recorded in ``infra_faults``, the model reads that the infrastructure failed (not
its code), and `reward_undetermined` says whether the episode's reward can still
be trusted.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from actors.tools_local import ToolResult, truncate
from actors.workspace import Workspace
from cluster.errors import is_retriable
from schemas import topics as T
from schemas.messages import (FAULT_INFRA, FAULT_POLICY, CompileRequest, CompileResult, EvaluateRequest,
                              EvaluateResult, RequestHeader, Task, fault_of)

log = logging.getLogger(__name__)


@dataclass
class EvalRecord:
    mode: str
    digest: str
    result: EvaluateResult


@dataclass
class InfraFault:
    """A remote call the infrastructure failed even after its retries: no verdict on the workspace."""

    mode: str  # compile | verify | both
    digest: str
    error: str


@dataclass
class RemoteTools:
    client: Any  # cluster.bus.client.AsyncRequestClient (or anything with `await request(topic, msg, ...)`)
    task: Task
    episode_id: str
    workspace: Workspace
    timeout_s: float = 300.0
    retries: int | None = None
    max_output_chars: int = 8000
    cuda_arch: str = ""
    infra_retries: int = 2  # extra attempts after an infrastructure fault
    infra_backoff_s: float = 1.0  # first backoff before such a retry; doubles each time
    evaluations: list[EvalRecord] = field(default_factory=list)
    infra_faults: list[InfraFault] = field(default_factory=list)
    compiles: int = 0
    infra_retried: int = 0  # retries spent on infrastructure faults in this episode
    _last_compile: tuple[str, CompileResult] | None = None

    async def call(self, name: str, args: dict) -> ToolResult:
        if name == "compile":
            res, text, fault = await self._compile()
            if fault == FAULT_INFRA:
                files = self.workspace.solution_files()
                self.infra_faults.append(InfraFault("compile", Workspace.digest(files), text))
            return ToolResult(text, ok=bool(res and res.ok))
        mode = {"verify": "verify", "profile": "both"}[name]
        rec, text = await self.evaluate(mode)
        return ToolResult(text, ok=bool(rec and rec.result.correct))

    async def _request(self, topic: str, msg: Any) -> tuple[Any, str, str]:
        """(reply, error text, fault): reply is None when the call failed; fault is the reply's or FAULT_INFRA."""
        from cluster.bus.client import RequestTimeout

        what = type(msg).__name__
        for attempt in range(self.infra_retries + 1):
            last = attempt == self.infra_retries
            if attempt:
                self.infra_retried += 1
                await asyncio.sleep(min(self.infra_backoff_s * 2 ** (attempt - 1), 30.0) * random.uniform(0.8, 1.2))
                # a fresh id: a late reply to the failed attempt must not answer this one
                header = dataclasses.replace(msg.header, request_id=RequestHeader().request_id)
                msg = dataclasses.replace(msg, header=header)
            try:
                reply = await self.client.request(topic, msg, timeout_s=self.timeout_s, retries=self.retries)
            except RequestTimeout as exc:  # the client's own timeout retries are spent: the reply is lost
                log.warning("remote tool %s: no reply: %s", what, exc)
                return None, infra_text(f"the {what} timed out with no reply ({exc})"), FAULT_INFRA
            except Exception as exc:  # noqa: BLE001 - any transport failure is an observation, not a crash
                log.warning("remote tool request failed (attempt %d): %s", attempt, exc)
                if is_retriable(exc) and not last:
                    continue
                return None, infra_text(f"remote tool unavailable: {type(exc).__name__}: {exc}"), FAULT_INFRA
            fault = fault_of(reply)
            if fault != FAULT_INFRA:
                return reply, "", fault
            error = getattr(reply, "error", "") or "unspecified"
            log.warning("remote tool %s: infrastructure fault from %s (attempt %d): %s", what,
                        getattr(reply, "worker", "") or "?", attempt, error[:300])
            if last:
                return None, infra_text(error), FAULT_INFRA
        raise AssertionError("unreachable")

    async def _compile(self) -> tuple[CompileResult | None, str, str]:
        files = self.workspace.solution_files()
        if "model_new.py" not in files:
            return None, "error: model_new.py does not exist yet", FAULT_POLICY
        digest = Workspace.digest(files)
        if self._last_compile and self._last_compile[0] == digest:
            res = self._last_compile[1]
            return res, _compile_text(res, self.max_output_chars, reused=True), fault_of(res)
        self.compiles += 1
        req = CompileRequest(header=RequestHeader(), episode_id=self.episode_id, files=files,
                             backend=self.task.backend, cuda_arch=self.cuda_arch, inline_artifact=False)
        reply, err, fault = await self._request(T.TOOL_COMPILE, req)
        if reply is None:
            return None, truncate(err, self.max_output_chars), fault
        if not isinstance(reply, CompileResult):
            return None, infra_text(f"compile worker answered with {type(reply).__name__}"), FAULT_INFRA
        self._last_compile = (digest, reply)
        return reply, _compile_text(reply, self.max_output_chars), fault

    async def evaluate(self, mode: str) -> tuple[EvalRecord | None, str]:
        """Compile if needed, then verify ('verify') or verify + profile ('both')."""
        files = self.workspace.solution_files()
        digest = Workspace.digest(files)
        cres, ctext, fault = await self._compile()
        if cres is None:
            if fault == FAULT_INFRA:
                self.infra_faults.append(InfraFault(mode, digest, ctext))
            return None, ctext
        if not cres.ok:
            result = EvaluateResult(request_id="", episode_id=self.episode_id, task_id=self.task.task_id,
                                    compiled=False, correct=False, reward=-1.0, error=cres.error or "compile failed",
                                    evidence={"compile_log": cres.log[-2000:]}, fault=FAULT_POLICY)
            rec = EvalRecord(mode, digest, result)
            self.evaluations.append(rec)
            return rec, ctext
        req = EvaluateRequest(header=RequestHeader(), episode_id=self.episode_id, task_id=self.task.task_id,
                              model_py=self.task.model_py, files=files, artifact_key=cres.artifact_key,
                              artifact_uri=cres.artifact_uri, mode=mode,
                              backend=self.task.backend)
        reply, err, fault = await self._request(T.evaluate_topic(self.task.backend), req)
        if reply is not None and not isinstance(reply, EvaluateResult):
            reply, err = None, infra_text(f"evaluation worker answered with {type(reply).__name__}")
        if reply is None:
            self.infra_faults.append(InfraFault(mode, digest, err))
            return None, truncate(err, self.max_output_chars)
        rec = EvalRecord(mode, digest, reply)
        self.evaluations.append(rec)
        return rec, evaluate_text(reply, self.max_output_chars)


def infra_text(detail: str) -> str:
    """What the model reads when the infrastructure, not its code, failed a remote call."""
    return (f"error: infrastructure failure (not caused by your code): {detail}\n"
            "This says nothing about your solution; call the tool again later.")


def _compile_text(res: CompileResult, limit: int, reused: bool = False) -> str:
    head = "compile: ok" if res.ok else f"compile: FAILED: {res.error}"
    notes = [n for n, on in (("cached", res.cached), ("sources unchanged since the last compile", reused)) if on]
    if notes:
        head += f" ({', '.join(notes)})"
    return truncate(f"{head}\n{res.log}".rstrip(), limit)


def evaluate_text(res: EvaluateResult, limit: int) -> str:
    lines = [f"compiled: {res.compiled}", f"correct: {res.correct}"]
    if res.speedup_vs_eager:
        lines.append(f"speedup_vs_eager: {res.speedup_vs_eager:.3f}")
    if res.speedup_vs_compile:
        lines.append(f"speedup_vs_compile: {res.speedup_vs_compile:.3f}")
    lines.append(f"reward: {res.reward:g}")
    if res.violations:
        lines.append("violations: " + "; ".join(res.violations))
    if res.error:
        lines.append(f"error: {res.error}")
    for k in ("correctness", "max_abs_diff", "message"):
        if k in res.evidence:
            lines.append(f"{k}: {res.evidence[k]}")
    return truncate("\n".join(lines), limit)


def episode_reward(evals: list[EvalRecord], reward_from: str) -> tuple[float, dict]:
    """Reward and evidence from the episode's evaluations (final or best); -1 without any."""
    if not evals:
        return -1.0, {"error": "no evaluation of a solution (none written, or the template left unchanged)"}
    full = [r for r in evals if r.mode == "both"] or evals  # profile runs carry the timing evidence
    pick = max(full, key=lambda r: r.result.reward) if reward_from == "best" else evals[-1]
    r = pick.result
    evidence = {"source": reward_from, "mode": pick.mode, "digest": pick.digest, "request_id": r.request_id,
                "compiled": r.compiled, "correct": r.correct, "speedup_vs_eager": r.speedup_vs_eager,
                "speedup_vs_compile": r.speedup_vs_compile, "violations": list(r.violations), "error": r.error,
                "timings": r.timings, "evidence": r.evidence, "worker": r.worker, "evaluations": len(evals),
                "at": time.time()}
    return float(r.reward), evidence


def reward_undetermined(evals: list[EvalRecord], faults: list[InfraFault], reward_from: str,
                        final_fault: InfraFault | None) -> str:
    """Why the episode's reward cannot be known ('' = it can).

    The final evaluation failed by the infrastructure: neither the final nor the best reward is known.
    With reward_from "best", so is any evaluation the infrastructure failed whose sources were never
    evaluated since: that one might have been the best.
    """
    if final_fault is not None:
        return f"the final evaluation failed (infrastructure): {final_fault.error[:500]}"
    if reward_from == "best":
        done = {r.digest for r in evals}
        lost = [f for f in faults if f.mode != "compile" and f.digest not in done]
        if lost:
            return f"{len(lost)} evaluation(s) failed (infrastructure) and were never redone: {lost[-1].error[:500]}"
    return ""
