"""Small builders shared by the actor tests."""
from __future__ import annotations

from pathlib import Path

from actors import tool_specs
from actors.agent import Episode, EpisodeLimits
from actors.chat import ChatRenderer
from actors.tools_local import LocalTools
from actors.tools_remote import RemoteTools
from actors.workspace import Workspace, skill_text
from schemas.messages import Task

RELU_DIR = Path(__file__).resolve().parents[2] / "skills" / "examples" / "cpu_19_relu"


def relu_task(task_id: str = "relu-1", **meta) -> Task:
    return Task(task_id=task_id, model_py=(RELU_DIR / "model.py").read_text(), backend="cpu", level=1,
                name="19_ReLU", source="test", metadata=dict(meta))


def relu_solution() -> dict[str, str]:
    return {"model_new.py": (RELU_DIR / "model_new.py").read_text(),
            "kernels/relu.cpp": (RELU_DIR / "kernels" / "relu.cpp").read_text()}


class NoRemote:
    """A request client for episodes that must not reach the bus."""

    async def request(self, *a, **kw):
        raise AssertionError("this episode should not call a remote tool")


def make_episode(policy, task: Task, root: Path, limits: EpisodeLimits, client=None, tool_timeout_s=30.0,
                 bash_timeout_s=10.0, episode_id="ep-test") -> Episode:
    ws = Workspace.create(root, episode_id, task.model_py, task.backend, starter=limits.mode != "single_turn")
    local = LocalTools(ws.root, protected=ws.protected, bash_timeout_s=bash_timeout_s, max_output_chars=4000)
    remote = RemoteTools(client or NoRemote(), task, episode_id, ws, timeout_s=tool_timeout_s, retries=0)
    renderer = ChatRenderer(policy.tokenizer, tool_specs.ALL)
    return Episode(policy, renderer, task, episode_id, "actor-test", ws, local, remote, limits,
                   skill_text(task.backend))
