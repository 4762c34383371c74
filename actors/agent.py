"""One episode of the agent: prompt, generate, parse tool calls, run tools, repeat; then score.

Multi-turn (default): a ReAct loop that ends on a ``finish`` call, the turn cap,
the context cap or an unrecoverable error; the final workspace is evaluated
(if the last evaluation does not already cover it) and the reward is taken from
the final or best evaluation. Single-turn: one response holding the whole
solution, extracted, written, compiled and evaluated by the actor itself.
The token stream is built as the episode runs (trajectory.py).

When the infrastructure kept the reward from being measured (the final
evaluation failed by an infrastructure fault after its retries; see
tools_remote.reward_undetermined) the trajectory's reward is NaN and its
``reward_status`` "undetermined": never a -1 or 0 the policy did not earn.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from actors import tool_specs, toolcall
from actors.chat import ChatRenderer
from actors.extract import extract_files
from actors.policy import GenRequest, Policy
from actors.tools_local import LocalTools, truncate
from actors.tools_remote import RemoteTools, episode_reward, reward_undetermined
from actors.trajectory import TrajectoryBuilder
from actors.workspace import Workspace
from cluster.config import stage_episode_mode
from schemas.messages import REWARD_OK, REWARD_UNDETERMINED, Task, Trajectory

log = logging.getLogger(__name__)


class PolicyFailure(Exception):
    """The policy backend failed in a way the episode cannot absorb (e.g. the engine died)."""


@dataclass
class EpisodeLimits:
    max_turns: int = 150
    max_context_tokens: int = 131072
    max_new_tokens: int = 512
    mode: str = "multi_turn"
    reward_from: str = "final"
    max_observation_chars: int = 8000
    final_eval_mode: str = "both"

    @classmethod
    def from_config(cls, acfg: Any, *, evaluation: bool = False) -> "EpisodeLimits":
        return cls(max_turns=acfg.eval_max_turns if evaluation else acfg.max_turns,
                   max_context_tokens=acfg.max_context_tokens, max_new_tokens=acfg.max_new_tokens,
                   mode=stage_episode_mode(acfg.episode_mode, "ppo"), reward_from=acfg.reward_from,
                   max_observation_chars=acfg.max_observation_chars,
                   final_eval_mode=getattr(acfg, "final_eval_mode", "both"))


def task_prompt(task: Task, single_turn: bool) -> str:
    head = f"Task {task.name or task.task_id} (backend: {task.backend}). The reference `model.py`:\n"
    body = f"```python\n{task.model_py.rstrip()}\n```\n"
    if single_turn:
        return (head + body + "Answer with the complete solution in one reply: every file as a fenced code "
                "block whose info string names its path, e.g. ```python model_new.py and ```cpp kernels/op.cpp.")
    return head + body + "Write model_new.py and kernels/, then compile, verify and profile; call finish when done."


class Episode:
    def __init__(self, policy: Policy, renderer: ChatRenderer, task: Task, episode_id: str, actor_id: str,
                 workspace: Workspace, local: LocalTools, remote: RemoteTools, limits: EpisodeLimits,
                 skill_md: str):
        self.policy, self.renderer, self.task = policy, renderer, task
        self.episode_id, self.workspace, self.local, self.remote = episode_id, workspace, local, remote
        self.limits, self.skill_md = limits, skill_md
        self.builder = TrajectoryBuilder(episode_id, task.task_id, actor_id, mode=limits.mode,
                                         has_logprobs=policy.has_logprobs)
        self.messages: list[dict] = []
        self.script = task.metadata.get("scripted_turns") if isinstance(task.metadata, dict) else None
        self.stats = {"gen_s": 0.0, "tool_s": 0.0, "final_eval_s": 0.0, "generated_tokens": 0}
        self.version_start = policy.version

    # -- the loop ---------------------------------------------------------------
    async def run(self) -> Trajectory:
        single = self.limits.mode == "single_turn"
        system = self.skill_md if single else self.renderer.system_text(self.skill_md)
        user = task_prompt(self.task, single)
        self.messages = self.renderer.messages_for_openai(system, user)
        prompt = self.renderer.prompt_ids(system, user)
        self.builder.add_prompt(prompt)
        if len(prompt) >= self.limits.max_context_tokens:
            return await self._finish("context_cap", final_eval=False)
        end = await (self._single_turn() if single else self._multi_turn())
        return await self._finish(end, final_eval=True)

    async def _generate(self, turn: int):
        budget = self.limits.max_context_tokens - len(self.builder)
        req = GenRequest(prompt_ids=list(self.builder.token_ids), max_tokens=min(self.limits.max_new_tokens, budget),
                         request_id=f"{self.episode_id}-t{turn}", messages=list(self.messages), turn=turn,
                         script=self.script)
        t0 = time.monotonic()
        try:
            gen = await self.policy.generate(req)
        except Exception as exc:  # a dead engine stops the actor; anything else ends the episode
            if engine_dead(exc):
                raise PolicyFailure(str(exc)) from exc
            log.warning("episode %s: generation failed: %s", self.episode_id, exc)
            return None
        self.stats["gen_s"] += time.monotonic() - t0
        self.stats["generated_tokens"] += len(gen.token_ids)
        info = self.builder.add_generation(gen.token_ids, gen.logprobs, gen.versions)
        self.messages.append({"role": "assistant", "content": gen.text})
        return gen, info

    async def _multi_turn(self) -> str:
        seen: set[str] = set()
        for turn in range(self.limits.max_turns):
            if len(self.builder) >= self.limits.max_context_tokens:
                return "context_cap"
            out = await self._generate(turn)
            if out is None:
                return "error"
            gen, info = out
            if gen.finish_reason == "length" and len(self.builder) >= self.limits.max_context_tokens:
                return "context_cap"
            parsed = toolcall.parse(gen.text, tool_specs.NAMES)
            info.malformed_tool_call = parsed.malformed
            finished, parts, names = False, [], []
            t0 = time.monotonic()
            for call in parsed.calls:
                if call.name == "finish":
                    finished = True
                    break
                key = call.key()
                info.repeated_action = info.repeated_action or key in seen
                seen.add(key)
                names.append(call.name)
                res = await (self.remote.call(call.name, call.arguments) if call.name in tool_specs.REMOTE_NAMES
                             else self.local.call(call.name, call.arguments))
                parts.append(f"[{call.name}]\n{res.output}")
            info.tool_latency_s = time.monotonic() - t0
            info.tool_name = ",".join(names + (["finish"] if finished else []))
            self.stats["tool_s"] += info.tool_latency_s
            parts += [f"error: malformed tool call: {e}" for e in parsed.errors]
            if finished:
                return "finish"
            if not parts:
                parts = ["error: no tool call found. Call a tool as <tool_call>{\"name\": ..., \"arguments\": "
                         "{...}}</tool_call>, or call finish when you are done."]
            if turn == self.limits.max_turns - 1:
                break
            obs = truncate("\n\n".join(parts), self.limits.max_observation_chars)
            obs_ids = self.renderer.observation_ids(obs, gen.last_token_text)
            if len(self.builder) + len(obs_ids) >= self.limits.max_context_tokens:
                return "context_cap"
            self.builder.add_observation(obs_ids)
            self.messages.append({"role": "tool", "content": obs})
        return "turn_cap"

    async def _single_turn(self) -> str:
        out = await self._generate(0)
        if out is None:
            return "error"
        gen, info = out
        files = extract_files(gen.text)
        written = self.workspace.write_files(files)
        info.malformed_tool_call = not written
        info.tool_name = "extract"
        if gen.finish_reason == "length" and len(self.builder) >= self.limits.max_context_tokens:
            return "context_cap"
        return "finish"

    # -- scoring ----------------------------------------------------------------
    async def _finish(self, end_reason: str, final_eval: bool) -> Trajectory:
        final_fault = None
        if final_eval:
            files = self.workspace.solution_files()
            digest = Workspace.digest(files)
            evals = self.remote.evaluations
            mode = self.limits.final_eval_mode
            covered = bool(evals) and evals[-1].mode in {mode, "both"} and evals[-1].digest == digest
            untouched = digest == self.workspace.initial_digest  # the template as given: nothing to score
            if "model_new.py" in files and not covered and not untouched:
                t0 = time.monotonic()
                faults = len(self.remote.infra_faults)
                rec, text = await self.remote.evaluate(mode)
                self.stats["final_eval_s"] = time.monotonic() - t0
                self.stats["final_eval_text"] = text[:2000]
                if rec is None and len(self.remote.infra_faults) > faults:
                    final_fault = self.remote.infra_faults[-1]
        reward, evidence = episode_reward(self.remote.evaluations, self.limits.reward_from)
        why = reward_undetermined(self.remote.evaluations, self.remote.infra_faults, self.limits.reward_from,
                                  final_fault)
        status = REWARD_UNDETERMINED if why else REWARD_OK
        if why:
            log.warning("episode %s: reward undetermined: %s", self.episode_id, why)
            reward, evidence["undetermined"] = math.nan, why
        evidence["stats"] = dict(self.stats)
        if self.remote.infra_faults or self.remote.infra_retried:
            evidence["infra"] = {"retries": self.remote.infra_retried,
                                 "faults": [{"mode": f.mode, "digest": f.digest, "error": f.error[:500]}
                                            for f in self.remote.infra_faults[-8:]]}
        meta = {"policy": self.policy.name, "version_start": self.version_start, "version_end": self.policy.version,
                "turns": len(self.builder.turns), "compiles": self.remote.compiles, "task_name": self.task.name,
                "trainable": getattr(self.policy, "trainable", True)}
        if isinstance(self.task.metadata, dict) and self.task.metadata.get("heldout"):
            meta["heldout"] = True  # a held-out task's episode: measured, never trained on (learner/data.py)
        return self.builder.build(reward, evidence, end_reason, meta, reward_status=status)


def engine_dead(exc: BaseException | None) -> bool:
    """True if ``exc`` (or what caused it) says the inference engine is gone."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ == "EngineDeadError" or "engine dead" in str(exc).lower():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False
