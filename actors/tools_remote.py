"""compile / verify / profile: the agent's remote tools, as requests over the bus.

Each call sends the workspace's solution files to the compile workers, then
(verify, profile) the built artifact to the evaluation workers of the task's
device kind, and turns the reply, a timeout or an error into text the model
reads. Every evaluation is kept: the episode's reward comes from them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from actors.tools_local import ToolResult, truncate
from actors.workspace import Workspace
from schemas import topics as T
from schemas.messages import CompileRequest, CompileResult, EvaluateRequest, EvaluateResult, RequestHeader, Task

log = logging.getLogger(__name__)


@dataclass
class EvalRecord:
    mode: str
    digest: str
    result: EvaluateResult


@dataclass
class RemoteTools:
    client: Any  # cluster.bus.AsyncRequestClient (or anything with `await request(topic, msg, ...)`)
    task: Task
    episode_id: str
    workspace: Workspace
    timeout_s: float = 300.0
    retries: int | None = None
    max_output_chars: int = 8000
    cuda_arch: str = ""
    evaluations: list[EvalRecord] = field(default_factory=list)
    compiles: int = 0
    _last_compile: tuple[str, CompileResult] | None = None

    async def call(self, name: str, args: dict) -> ToolResult:
        if name == "compile":
            res, text = await self._compile()
            return ToolResult(text, ok=bool(res and res.ok))
        mode = {"verify": "verify", "profile": "both"}[name]
        rec, text = await self.evaluate(mode)
        return ToolResult(text, ok=bool(rec and rec.result.correct))

    async def _request(self, topic: str, msg: Any) -> tuple[Any, str]:
        from cluster.bus import RequestTimeout

        try:
            reply = await self.client.request(topic, msg, timeout_s=self.timeout_s, retries=self.retries)
            return reply, ""
        except RequestTimeout as exc:
            return None, f"error: the {type(msg).__name__} timed out ({exc}); try again later"
        except Exception as exc:  # noqa: BLE001 - any transport failure is an observation, not a crash
            log.warning("remote tool request failed: %s", exc)
            return None, f"error: remote tool unavailable: {type(exc).__name__}: {exc}"

    async def _compile(self) -> tuple[CompileResult | None, str]:
        files = self.workspace.solution_files()
        if "model_new.py" not in files:
            return None, "error: model_new.py does not exist yet"
        digest = Workspace.digest(files)
        if self._last_compile and self._last_compile[0] == digest:
            res = self._last_compile[1]
            return res, _compile_text(res, self.max_output_chars, reused=True)
        self.compiles += 1
        req = CompileRequest(header=RequestHeader(), episode_id=self.episode_id, files=files,
                             backend=self.task.backend, cuda_arch=self.cuda_arch)
        reply, err = await self._request(T.TOOL_COMPILE, req)
        if reply is None:
            return None, err
        if not isinstance(reply, CompileResult):
            return None, f"error: compile worker answered with {type(reply).__name__}"
        self._last_compile = (digest, reply)
        return reply, _compile_text(reply, self.max_output_chars)

    async def evaluate(self, mode: str) -> tuple[EvalRecord | None, str]:
        """Compile if needed, then verify ('verify') or verify + profile ('both')."""
        cres, ctext = await self._compile()
        if cres is None:
            return None, ctext
        files = self.workspace.solution_files()
        digest = Workspace.digest(files)
        if not cres.ok:
            result = EvaluateResult(request_id="", episode_id=self.episode_id, task_id=self.task.task_id,
                                    compiled=False, correct=False, reward=-1.0, error=cres.error or "compile failed",
                                    evidence={"compile_log": cres.log[-2000:]})
            rec = EvalRecord(mode, digest, result)
            self.evaluations.append(rec)
            return rec, ctext
        req = EvaluateRequest(header=RequestHeader(), episode_id=self.episode_id, task_id=self.task.task_id,
                              model_py=self.task.model_py, files=files, artifact_key=cres.artifact_key,
                              artifact_uri=cres.artifact_uri, artifact=cres.artifact, mode=mode,
                              backend=self.task.backend)
        reply, err = await self._request(T.evaluate_topic(self.task.backend), req)
        if reply is None:
            return None, err
        if not isinstance(reply, EvaluateResult):
            return None, f"error: evaluation worker answered with {type(reply).__name__}"
        rec = EvalRecord(mode, digest, reply)
        self.evaluations.append(rec)
        return rec, evaluate_text(reply, self.max_output_chars)


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
