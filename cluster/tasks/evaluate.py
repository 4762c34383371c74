"""Evaluate a policy over a task set: ready solutions (locally or over the bus) or agent episodes.

Three ways to get one EvaluateResult-like dict per task:
  * ``LocalSolutions``: the sandbox's one-shot evaluator in this machine (compile + verify + profile);
  * ``BusSolutions``: CompileRequest then EvaluateRequest to the sandbox workers through Kafka (the
    evaluation carries the artifact's content key, not its bytes: the evaluation worker takes the
    artifact from its cache or the compile workers, as for the actor's tools);
  * ``run_episodes``: the actor's episode runner with a vllm/openai policy (the hook for
    `kernelrl eval --policy vllm|openai`): each episode's final evaluation is its result.
A task without a solution is recorded as not correct.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

from cluster.tasks.dataset import TaskEntry
from cluster.tasks.metrics import TaskResult

log = logging.getLogger(__name__)


def find_solution(sol_dir: Path, entry: TaskEntry) -> dict[str, str] | None:
    """The solution files for a task: a folder (model_new.py + kernels/) or a single ModelNew .py file.

    Looked up by task id, by the task file's stem (with or without its level folder),
    case-insensitively as ``<backend>_<stem>`` (the layout of skills/examples, e.g. cpu_19_relu),
    and last by content: a ``<backend>_*`` folder whose ``model.py`` is the task's own source
    (skills/examples/cuda_26_gelu solves KernelBench's 26_GELU_.py).
    """
    stem = Path(entry.file).stem
    rel_parent = Path(entry.file).parent
    names = [entry.task_id, stem, str(rel_parent / stem), f"level{entry.level}/{stem}"]
    wanted = {f"{entry.backend}_{stem}".lower(), stem.lower()}
    if sol_dir.is_dir():
        names += sorted(p.name.removesuffix(".py") for p in sol_dir.iterdir()
                        if p.name.lower().removesuffix(".py") in wanted)
        names += _by_task_source(str(sol_dir), entry.backend).get(entry.model_py.strip(), [])
    for name in names:
        d = sol_dir / name
        if (d / "model_new.py").is_file():
            files = {"model_new.py": (d / "model_new.py").read_text()}
            kdir = d / "kernels"
            if kdir.is_dir():
                for p in sorted(kdir.iterdir()):
                    if p.is_file():
                        files[f"kernels/{p.name}"] = p.read_text()
            return files
        f = sol_dir / f"{name}.py"
        if f.is_file():
            return {"model_new.py": f.read_text()}
    return None


@lru_cache(maxsize=16)
def _by_task_source(sol_dir: str, backend: str) -> dict[str, list[str]]:
    """Solution folders named ``<backend>_*`` keyed by the task source their model.py holds."""
    out: dict[str, list[str]] = {}
    for d in sorted(Path(sol_dir).glob(f"{backend}_*")):
        ref = d / "model.py"
        if ref.is_file() and (d / "model_new.py").is_file():
            out.setdefault(ref.read_text().strip(), []).append(d.name)
    return out


def _missing(entry: TaskEntry, why: str = "no solution") -> TaskResult:
    return TaskResult(task_id=entry.task_id, name=entry.name, level=entry.level, backend=entry.backend,
                      has_solution=False, error=why)


class LocalSolutions:
    """Each solution through sandbox_workers' one-shot Evaluator (its own sandboxed children).

    With ``workers`` > 1 on the CPU backend each pool thread gets its own evaluator pinned to its own slice
    of the cores, so concurrent evaluations do not time each other's OpenMP pools (sandbox_workers.cpuset).
    """

    def __init__(self, cfg, backend: str, workers: int = 1):
        import threading

        from sandbox_workers import cpuset

        self.cfg, self.backend = cfg, backend
        cores = cpuset.parse(cfg.sandbox.cpu_cores) if cfg.sandbox.cpu_cores else cpuset.available()
        self._slices = cpuset.split(cores, workers) if backend == "cpu" and (workers > 1 or cfg.sandbox.cpu_cores) else []
        self._local, self._lock, self._made = threading.local(), threading.Lock(), []

    def _evaluator(self):
        ev = getattr(self._local, "evaluator", None)
        if ev is None:
            from sandbox_workers import cpuset
            from sandbox_workers.evaluator import Evaluator

            with self._lock:
                if self._slices:
                    cpuset.pin(self._slices[len(self._made) % len(self._slices)])  # before the evaluator's key
                ev = self._local.evaluator = Evaluator(self.cfg, self.backend)
                self._made.append(ev)
        return ev

    def evaluate(self, entry: TaskEntry, files: dict[str, str]) -> dict:
        return self._evaluator().evaluate(entry.model_py, files, mode="both")

    def close(self) -> None:
        for ev in self._made:
            ev.close()


class BusSolutions:
    """Each solution through the compile and evaluation workers over Kafka (request/reply)."""

    def __init__(self, cfg, backend: str, timeout_s: float | None = None):
        from cluster.bus.client import Bus, RequestClient

        self.cfg, self.backend = cfg, backend
        self.timeout_s = timeout_s or max(cfg.sandbox.compile_timeout_s, cfg.sandbox.eval_timeout_s) + 60
        self.bus = Bus(cfg, client_id="kernelrl-eval")
        self.client = RequestClient(self.bus, name=f"kernelrl-eval-{int(time.time() * 1000) % 100000}")

    def evaluate(self, entry: TaskEntry, files: dict[str, str]) -> dict:
        from schemas import topics
        from schemas.messages import CompileRequest, EvaluateRequest, RequestHeader, new_id

        episode = f"eval-{entry.task_id}-{new_id()[:8]}"
        comp = self.client.request(topics.TOOL_COMPILE, CompileRequest(
            header=RequestHeader(), episode_id=episode, files=files, backend=self.backend,
            cuda_arch=self.cfg.sandbox.cuda_arch, inline_artifact=False), timeout_s=self.timeout_s)
        if not comp.ok:
            return {"compiled": False, "correct": False, "reward": -1.0, "error": comp.error or "compile failed",
                    "violations": [], "timings": {}}
        res = self.client.request(topics.evaluate_topic(self.backend), EvaluateRequest(
            header=RequestHeader(), episode_id=episode, task_id=entry.task_id, model_py=entry.model_py, files=files,
            artifact_key=comp.artifact_key, artifact_uri=comp.artifact_uri, mode="both",
            backend=self.backend), timeout_s=self.timeout_s)
        return {"compiled": res.compiled, "correct": res.correct, "reward": res.reward,
                "speedup_vs_eager": res.speedup_vs_eager, "speedup_vs_compile": res.speedup_vs_compile,
                "violations": list(res.violations), "error": res.error, "timings": res.timings,
                "duration_s": res.duration_s}

    def close(self) -> None:
        self.client.close()
        close = getattr(self.bus, "close", None)
        if close:
            close()


def run_solutions(entries: list[TaskEntry], solutions: dict[str, dict[str, str] | None], runner,
                  workers: int = 1, on_result=None) -> list[TaskResult]:
    """One TaskResult per task, in order; evaluation failures become incorrect results, never exceptions.

    ``solutions`` maps task id -> files (``find_solution``, looked up by the caller before any
    rewrite of the tasks: shrunk shapes no longer match a solution's model.py). ``on_result(res)``
    is called as each task finishes (in completion order), so a long run shows progress and a run
    that is stopped half-way keeps what it finished.
    """
    def one(entry: TaskEntry) -> TaskResult:
        res = _one(entry)
        if on_result is not None:
            on_result(res)
        return res

    def _one(entry: TaskEntry) -> TaskResult:
        files = solutions.get(entry.task_id)
        if files is None:
            return _missing(entry)
        t0 = time.monotonic()
        try:
            raw = runner.evaluate(entry, files)
        except Exception as exc:  # noqa: BLE001 - one broken evaluation is one failed task
            log.warning("evaluation of %s failed: %s", entry.task_id, exc)
            raw = {"error": f"{type(exc).__name__}: {exc}", "duration_s": time.monotonic() - t0}
        res = TaskResult.from_eval(entry.task_id, entry.name, entry.level, entry.backend, raw)
        log.info("%s: correct=%s eager=%.3fx compile=%.3fx", entry.task_id, res.correct, res.speedup_vs_eager,
                 res.speedup_vs_compile)
        return res

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, entries))


async def run_episodes(cfg, entries: list[TaskEntry], model_path: str = "", on_result=None) -> list[TaskResult]:
    """The vllm/openai hook: one agent episode per task through the actor's episode runner.

    Needs the bus and the sandbox workers running (e.g. under `kernelrl up`). The episode's
    reward evidence (final evaluation; `actor.reward_from`) is the task's result.
    """
    from actors.actor import Actor
    from actors.policy import make_policy
    from cluster.models.importer import resolve_model_path

    policy = await make_policy(cfg, resolve_model_path(cfg, model_path or cfg.actor.model_path))
    actor = Actor(cfg, policy, actor_id="kernelrl-eval", evaluation=True)
    out = []
    try:
        for entry in entries:
            traj = await actor.run_episode(entry.to_message())
            ev = dict(traj.evidence or {})
            ev.setdefault("reward", traj.reward)
            out.append(TaskResult.from_eval(entry.task_id, entry.name, entry.level, entry.backend, ev))
            if on_result is not None:
                on_result(out[-1])
    finally:
        await policy.close()
    return out
