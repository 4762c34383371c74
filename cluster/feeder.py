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

from schemas import Task, topics

log = logging.getLogger(__name__)


def load_task_files(folder: str | Path, backend: str = "cpu") -> list[Task]:
    """Read KernelBench-style task files (``*.py`` with a ``Model``) from a folder tree."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"task folder {str(folder)!r} does not exist")
    if (folder / "index.json").is_file():  # a kernelrl task set (e.g. the built-in one): its index says
        from actors.tasks.dataset import load_tasks  # which tasks are sized for this backend

        return [e.to_message() for e in load_tasks(folder, backend=backend)]
    tasks = []
    for path in sorted(folder.rglob("*.py")):
        text = path.read_text()
        if "class Model" not in text or "def get_inputs" not in text:
            continue
        level = next((int(p[5:]) for p in path.parts if p.startswith("level") and p[5:].isdigit()), 0)
        tasks.append(Task(task_id=path.stem, model_py=text, backend=backend, level=level, name=path.stem,
                          source=str(path.relative_to(folder))))
    if not tasks:
        raise FileNotFoundError(f"no task files (class Model + get_inputs) under {str(folder)!r}")
    return tasks


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
        self.stop_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name="task-feeder", daemon=True)

    def start(self) -> "Feeder":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self._thread.join(timeout=10)

    def _open(self, group_lag) -> bool:
        return all(group_lag(self.bus, group, [topic])[topic] < limit for group, topic, limit in self.gates)

    def _run(self) -> None:
        from cluster.bus_lag import group_lag

        producer = self.bus.producer()
        rounds = itertools.count()
        try:
            for r in rounds:
                for task in self.tasks:
                    while not self.stop_event.is_set() and not self._open(group_lag):
                        self.stop_event.wait(0.5)
                    if self.stop_event.is_set() or (self.limit and self.published >= self.limit):
                        return
                    item = Task(task_id=f"{task.name}@{r}", model_py=task.model_py, backend=task.backend,
                                level=task.level, name=task.name, source=task.source, metadata=task.metadata)
                    producer.send(topics.TASKS, item, key=item.task_id)
                    producer.flush()
                    self.published += 1
        except Exception:  # noqa: BLE001 - a dead feeder must be loud, not silent
            log.exception("task feeder failed")
            raise
        finally:
            producer.close()
