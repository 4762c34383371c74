"""Keeps the tasks topic fed during a run: publishes tasks round-robin from a folder,
holding the actors' unconsumed backlog near a target so tasks are not piled up.

Each published Task gets a fresh id (``<name>@<round>``) so the same problem can be
rolled out many times and every rollout stays traceable.
"""
from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path

from cluster.errors import KernelRLError, is_retriable
from schemas import Task, topics

log = logging.getLogger(__name__)


SOLUTION_SUFFIX = ".solution"  # <task>.solution/ beside <task>.py: a correct solution, replayed as a demonstration


def read_solution(folder: Path) -> dict[str, str]:
    """A solution folder's model_new.py and kernels/* as {path: text} ({} when there is none)."""
    if not folder.is_dir():
        return {}
    files = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and (rel == "model_new.py" or rel.startswith("kernels/")):
            files[rel] = p.read_text()
    return files


def load_task_files(folder: str | Path, backend: str = "cpu") -> list[Task]:
    """Read KernelBench-style task files (``*.py`` with a ``Model``) from a folder tree."""
    from cluster.errors import InputError

    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"task folder {str(folder)!r} does not exist")
    if (folder / "index.json").is_file():  # a kernelrl task set (e.g. the built-in one): its index says
        from cluster.tasks.dataset import load_tasks  # which tasks are sized for this backend

        return [e.to_message() for e in load_tasks(folder, backend=backend)]
    tasks = []
    for path in sorted(folder.rglob("*.py")):
        if any(part.endswith(SOLUTION_SUFFIX) for part in path.relative_to(folder).parts):
            continue  # a demonstration's files, not a task
        text = path.read_text()
        if "class Model" not in text or "def get_inputs" not in text:
            continue
        try:  # a task that does not parse fails every episode: refuse the folder now, naming the file
            compile(text, str(path), "exec")
        except SyntaxError as exc:
            raise InputError(f"task file {str(path)!r} is not valid Python (line {exc.lineno}: {exc.msg})") from None
        level = next((int(p[5:]) for p in path.parts if p.startswith("level") and p[5:].isdigit()), 0)
        demo = read_solution(path.with_name(path.stem + SOLUTION_SUFFIX))
        tasks.append(Task(task_id=path.stem, model_py=text, backend=backend, level=level, name=path.stem,
                          source=str(path.relative_to(folder)), metadata={"demonstration": demo} if demo else {}))
    if not tasks:
        raise InputError(f"no task files (class Model + get_inputs) under {str(folder)!r}")
    return tasks


def load_heldout_tasks(folder: str | Path, train: list[Task], backend: str = "cpu") -> list[Task]:
    """Held-out task files: marked ``metadata.heldout`` (the actor copies it into the trajectory, the learner
    drops such episodes, the report counts them apart) and stripped of any solution, so they are never
    demonstrated. A name shared with a training task is refused (its episodes could not be told apart)."""
    from cluster.errors import InputError

    tasks = load_task_files(folder, backend=backend)
    clash = sorted({t.name for t in tasks} & {t.name for t in train})
    if clash:
        raise InputError(f"held-out tasks {clash} in {str(folder)!r} have the names of training tasks")
    for t in tasks:
        t.metadata = {"heldout": True}
    return tasks


class FeederFailed(KernelRLError):
    """The feeder hit an error no retry can fix (a task larger than the broker takes, no authorization)."""


class Feeder:
    """Background thread: publish tasks while every gate is open.

    A gate is ``(group, topic, limit)``: open while that group's lag on that topic is
    below ``limit``. Gating on the actors' task backlog keeps tasks from piling up;
    gating on the learner's trajectory backlog bounds how far rollouts run ahead of
    training (AReaL-style staleness control), so little work is wasted on samples the
    learner would drop as stale.
    """

    def __init__(self, bus, tasks: list[Task], gates: list[tuple[str, str, int]], limit: int = 0):
        self.bus, self.tasks, self.gates = bus, tasks, gates
        self.limit = limit
        self.published = 0
        self.error: FeederFailed | None = None  # why the feeder stopped on its own, if it did
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="task-feeder", daemon=True)

    def start(self) -> "Feeder":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join(timeout=10)

    def drop_gate(self, topic: str) -> None:
        """Stop waiting on ``topic``'s backlog (the learner has finished: nothing reads its trajectories now)."""
        self.gates = [g for g in self.gates if g[1] != topic]

    def check(self) -> None:
        """Raise the error that stopped the feeder (the run would otherwise wait for tasks that never come)."""
        if self.error is not None:
            raise self.error

    def _open(self, group_lag) -> bool:
        return all(group_lag(self.bus, group, [topic])[topic] < limit for group, topic, limit in self.gates)

    def _run(self) -> None:
        from cluster.bus.lag import group_lag

        producer = self.bus.producer()
        try:
            for r in itertools.count():
                for task in self.tasks:
                    item = Task(task_id=f"{task.name}@{r}", model_py=task.model_py, backend=task.backend,
                                level=task.level, name=task.name, source=task.source, metadata=task.metadata)
                    if not self._publish(producer, item, group_lag):
                        return
        finally:
            producer.close()

    def _publish(self, producer, item: Task, group_lag) -> bool:
        """Wait for the gates, then publish ``item``; retries until it is acked or we stop.

        Right after topic creation the cluster's metadata may lag, and a broker may be
        restarting: both are transient, so the feeder waits them out instead of dying
        (a dead feeder would stall the whole run). An error no retry can fix stops the
        feeder and is kept in ``error`` for ``check`` to raise."""
        backoff = 0.5
        while not self.stop_event.is_set():
            if self.limit and self.published >= self.limit:
                return False
            try:
                if not self._open(group_lag):
                    self.stop_event.wait(0.5)
                    continue
                producer.send(topics.TASKS, item, key=item.task_id).get(timeout=30)
                self.published += 1
                return True
            except Exception as exc:  # noqa: BLE001 - sorted by is_retriable: transient ones are waited out
                if not is_retriable(exc):  # a task too large, no authorization: every retry would fail the same
                    self.error = FeederFailed(f"task feeder stopped at task {item.task_id}: "
                                              f"{type(exc).__name__}: {exc} (a retry cannot help)")
                    log.error("%s", self.error)
                    self.stop_event.set()
                    return False
                log.warning("task feeder: %s: %s; retrying in %.1fs", type(exc).__name__, exc, backoff)
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 10.0)
        return False
