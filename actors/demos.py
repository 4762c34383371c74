"""Demonstrations: episodes that replay a task's known solution, scored by the real oracle, for RFT.

A task with a solution (``<task>.solution/`` beside its file, see cluster/launch/feeder.py) can be replayed by
the scripted policy: single-turn as one reply holding every file as a fenced block, multi-turn as
``write`` calls, then compile, verify and finish. Each replay is a real episode: its files go through
the compile and evaluation workers over the bus and its reward is the oracle's, never assumed. The
trajectories carry ``metadata.demonstration`` and no log-probs, so only the RFT stage trains on them
(PPO needs the behaviour policy's log-probs, and the stage filters drop them there).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from cluster.config import stage_episode_mode
from schemas import topics as T
from schemas.messages import Task, new_id

log = logging.getLogger(__name__)


def single_turn_answer(files: dict[str, str]) -> str:
    """The whole solution as one reply: each file a fenced block whose info string names its path."""
    blocks = []
    for path, text in files.items():
        lang = "python" if path.endswith(".py") else "cpp"
        blocks.append(f"```{lang} {path}\n{text.rstrip()}\n```")
    return "\n".join(blocks)


def multi_turn_script(files: dict[str, str]) -> list[str]:
    """The solution as tool calls: write each file, compile, verify, finish."""
    call = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>'
    writes = [call % ("write", json.dumps({"path": p, "content": t})) for p, t in files.items()]
    return [" ".join(writes), call % ("compile", "{}"), call % ("verify", "{}"), call % ("finish", "{}")]


def script_for(task: Task, mode: str) -> list[str] | None:
    files = (task.metadata or {}).get("demonstration")
    if not files:
        return None
    return [single_turn_answer(files)] if mode == "single_turn" else multi_turn_script(files)


async def _replay(cfg: Any, tasks: list[Task], count: int, model_path: str) -> dict:
    from actors.actor import Actor
    from actors.policy import ScriptedPolicy, load_tokenizer

    mode = stage_episode_mode(cfg.actor.episode_mode, "rft")  # demonstrations are RFT's
    demo_tasks = [(t, script_for(t, mode)) for t in tasks]
    demo_tasks = [(t, s) for t, s in demo_tasks if s]
    if not demo_tasks or count <= 0:
        return {"published": 0, "passed": 0}
    policy = ScriptedPolicy(load_tokenizer(model_path), [])
    actor = Actor(cfg, policy, actor_id="demonstrations")
    loop = asyncio.get_running_loop()
    producer = await loop.run_in_executor(None, actor.bus.producer)
    sem = asyncio.Semaphore(max(1, cfg.actor.concurrency))
    out = {"published": 0, "passed": 0}

    async def one(i: int) -> None:
        task, script = demo_tasks[i % len(demo_tasks)]
        item = Task(task_id=f"{task.name}@demo{i}", model_py=task.model_py, backend=task.backend, level=task.level,
                    name=task.name, source=task.source, metadata={"scripted_turns": script})
        async with sem:
            traj = await actor.run_episode(item, episode_id=new_id())
        traj.metadata["demonstration"] = True
        await loop.run_in_executor(None, lambda: producer.send(T.TRAJECTORIES, traj, key=traj.task_id).get(timeout=60))
        out["published"] += 1
        out["passed"] += int(traj.reward > 0)
        log.info("demonstration %d/%d (%s): reward %+.0f", out["published"], count, task.name, traj.reward)

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await loop.run_in_executor(None, producer.close)
        await actor.client.aclose()
        actor.bus.close()
    return out


def publish_demonstrations(cfg: Any, tasks: list[Task], count: int, model_path: str) -> dict:
    """Replay ``count`` demonstrations (round-robin over the tasks that have a solution) and publish their
    trajectories; returns {"published": n, "passed": n with reward > 0}."""
    return asyncio.run(_replay(cfg, tasks, count, model_path))
