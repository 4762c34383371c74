"""The rollout actor: consume tasks as a group member, run up to C episodes, publish trajectories.

A task's offset is committed only after its trajectory is acknowledged by all
replicas (and only once every earlier task of its partition is done too), so
an actor killed at any moment loses no task: the group hands it to another
actor. A trajectory the broker refuses for good (too large) dead-letters its
task with the reason, and the partition moves on. New episodes are not started while the policy lags the newest announced
version by more than ``actor.max_version_lag`` (admission control).
Consumer calls run on one dedicated thread (kafka-python is not thread-safe).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from actors import tool_specs
from actors.agent import Episode, EpisodeLimits, PolicyFailure, engine_dead
from actors.chat import ChatRenderer
from actors.offsets import OffsetTracker
from actors.task_check import task_problem
from actors.tools_local import LocalTools
from actors.tools_remote import RemoteTools
from actors.workspace import Workspace, single_turn_skill_text, skill_text
from cluster import metrics
from cluster.config import episode_mode_at
from cluster.errors import RetriableError, is_retriable, retry_async
from schemas import topics as T
from schemas.messages import Task, Trajectory, new_id

log = logging.getLogger(__name__)


def default_actor_id() -> str:
    return f"actor-{socket.gethostname()}-{os.getpid()}"


class Actor:
    def __init__(self, cfg: Any, policy: Any, *, actor_id: str | None = None, bus: Any = None,
                 request_client: Any = None, evaluation: bool = False):
        from cluster.bus.client import AsyncRequestClient, Bus
        from cluster.config import cache_path, run_cache_path

        self.cfg, self.policy = cfg, policy
        self.actor_id = actor_id or default_actor_id()
        self.bus = bus or Bus(cfg, client_id=self.actor_id)
        self.client = request_client or AsyncRequestClient(self.bus, name=self.actor_id)
        self.limits = EpisodeLimits.from_config(cfg.actor, evaluation=evaluation)
        self.ws_root = Path(cfg.actor.workspace_root) if cfg.actor.workspace_root else cache_path(cfg, "workspaces")
        # per set of topics, like the learner's checkpoints: two runs on one machine each assemble their own v1
        self.weights_root = (Path(cfg.actor.weights_dir) if cfg.actor.weights_dir
                             else run_cache_path(cfg, "actor-weights"))
        self.renderer = ChatRenderer(policy.tokenizer, tool_specs.ALL)
        self.tracker = OffsetTracker()
        self._cthread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"{self.actor_id}-tasks")
        self.follower = None
        self.stats = {"episodes": 0, "published": 0, "committed": 0, "errors": 0, "tokens": 0,
                      "admission_waits": 0, "publish_failures": 0, "refused": 0}
        self.fatal: BaseException | None = None
        self.published_tasks: list[str] = []  # task ids in publishing order (a redelivered task shows twice)

    # -- lifecycle --------------------------------------------------------------
    def close(self) -> None:
        """Close the request client and the bus (their Kafka clients' threads otherwise outlive the actor, and a
        producer whose broker is gone keeps a core busy reconnecting: docs/learning/s14-suite-slowdown.txt)."""
        self.client.close()
        self.bus.close()
        self._cthread.shutdown(wait=False)

    async def run(self, stop: asyncio.Event, max_episodes: int | None = None) -> int:
        """Serve until ``stop`` is set (or ``max_episodes`` finished); returns the number published."""
        loop = asyncio.get_running_loop()
        self.producer = await loop.run_in_executor(None, self.bus.producer)
        group = self.bus.group("actors")
        consumer = await loop.run_in_executor(self._cthread, lambda: self.bus.consumer(
            [T.TASKS], group, expected=Task))
        tasks: set[asyncio.Task] = set()
        follower_task = None
        if hasattr(self.policy, "swap_weights"):
            from actors.weights import WeightFollower

            self.follower = WeightFollower(self.bus, self.cfg, self.policy, self.actor_id, self.weights_root)
            follower_task = asyncio.create_task(self.follower.run(stop), name="weights")
        pending: collections.deque = collections.deque()  # polled, not yet admitted
        try:
            while not stop.is_set() and self.fatal is None:
                if max_episodes is not None and self.stats["published"] + len(tasks) >= max_episodes:
                    if not tasks:
                        break
                    await asyncio.wait(tasks, timeout=0.2)
                    continue
                free = self.cfg.actor.concurrency - len(tasks)
                admitted = self._admitted()
                while admitted and free > 0 and pending:  # admission is decided when an episode starts
                    rec = pending.popleft()
                    t = asyncio.create_task(self._episode(rec, consumer), name=f"episode-{rec.offset}")
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
                    free -= 1
                want = free if admitted and not pending else 0
                # With nothing wanted, keep polling (group liveness) with the partitions paused.
                try:
                    recs = await loop.run_in_executor(self._cthread, _poll, consumer, want)
                except RetriableError as exc:  # broker away: running episodes go on; poll again later
                    if not is_retriable(exc):  # e.g. no longer authorized: polling again cannot help
                        raise
                    log.warning("task poll failed (%s); retrying", exc)
                    await asyncio.sleep(1.0)
                    continue
                for rec in recs:
                    self.tracker.delivered(rec)
                    why = task_problem(rec.msg)
                    if why:  # refused at once: it holds back no commit
                        t = asyncio.create_task(self._refuse(rec, consumer, f"task refused: {why}"))
                        tasks.add(t)
                        t.add_done_callback(tasks.discard)
                    else:
                        pending.append(rec)
                if not recs:
                    await asyncio.sleep(0)
        finally:
            await self._drain(tasks)
            if follower_task is not None:
                stop.set()
                await asyncio.gather(follower_task, return_exceptions=True)
            await loop.run_in_executor(self._cthread, consumer.close)
            await loop.run_in_executor(None, self.producer.close)
        if self.fatal is not None:
            raise self.fatal
        return self.stats["published"]

    def _admitted(self) -> bool:
        """Admission control: no new episode while the policy lags the newest announced version by > K."""
        if self.follower is None or self.follower.lag <= self.cfg.actor.max_version_lag:
            return True
        self.stats["admission_waits"] += 1
        return False

    async def _drain(self, tasks: set[asyncio.Task]) -> None:
        if not tasks:
            return
        grace = self.cfg.actor.shutdown_grace_s
        done, pending = await asyncio.wait(tasks, timeout=grace)
        for t in pending:  # unfinished episodes stay uncommitted: the group redelivers their tasks
            t.cancel()
        if pending:
            log.warning("%d episode(s) cancelled at shutdown; their tasks will be redelivered", len(pending))
            await asyncio.gather(*pending, return_exceptions=True)

    # -- one episode --------------------------------------------------------------
    async def run_episode(self, task: Task, episode_id: str | None = None) -> Trajectory:
        """Run one episode in a fresh workspace and return its trajectory (not published)."""
        traj, errored = await run_episode(self.cfg, self.policy, self.renderer, task, self.client, self.ws_root,
                                          self.actor_id, self.limits_now(), episode_id)
        self.stats["errors"] += int(errored)
        return traj

    def limits_now(self) -> EpisodeLimits:
        """The limits of an episode starting now: with ``actor.episode_mode = "by_stage"`` its mode follows the
        stage of the learner's next step, as known from the newest version this actor applied."""
        steps = self.follower.learner_steps if self.follower is not None else 0
        return dataclasses.replace(self.limits, mode=episode_mode_at(self.cfg, steps))

    async def _episode(self, rec: Any, consumer: Any) -> None:
        task: Task = rec.msg
        t0 = time.monotonic()
        metrics.add_gauge("episodes_in_flight", 1)
        try:
            traj = await self.run_episode(task)
        except PolicyFailure as exc:
            log.error("policy failed; stopping without committing task %s: %s", task.task_id, exc)
            self.fatal = exc
            return
        except RetriableError as exc:  # the infrastructure, not the task: another actor may take it
            log.error("episode of task %s could not run; stopping without committing it: %s", task.task_id, exc)
            self.fatal = exc
            return
        except Exception as exc:  # noqa: BLE001 - a task its episode cannot even start is lettered, not lost
            await self._refuse(rec, consumer, f"episode could not start: {type(exc).__name__}: {exc}")
            return
        finally:
            metrics.add_gauge("episodes_in_flight", -1)
        _record_episode(traj, time.monotonic() - t0)
        traj.metadata.update({"task_offset": rec.offset, "task_partition": rec.partition,
                              "episode_s": round(time.monotonic() - t0, 3)})
        self.stats["episodes"] += 1
        self.stats["tokens"] += int(traj.loss_mask.sum())
        await self._publish_and_commit(rec, consumer, traj)

    async def _refuse(self, rec: Any, consumer: Any, why: str) -> None:
        """Dead-letter a task with the reason, then commit past it as if its episode had finished."""
        from cluster.bus.serve import dead_letter_record

        loop = asyncio.get_running_loop()
        self.stats["refused"] += 1
        metrics.inc("tasks_dead_lettered")
        try:
            await loop.run_in_executor(None, dead_letter_record, self.bus, rec, why)
        except Exception as exc:  # noqa: BLE001 - no letter, no commit: the task comes back to be refused again
            log.error("could not dead-letter task %s (%s); leaving it uncommitted", rec.msg.task_id, exc)
            return
        await self._commit_done(rec, consumer)

    async def _commit_done(self, rec: Any, consumer: Any) -> None:
        commit_to = self.tracker.done(rec)
        if commit_to is not None:
            ok = await asyncio.get_running_loop().run_in_executor(self._cthread, consumer.commit, commit_to)
            self.stats["committed"] += int(bool(ok))

    async def _publish_and_commit(self, rec: Any, consumer: Any, traj: Trajectory) -> None:
        """Publish the trajectory, then commit its task. A transient failure is retried; one no retry can fix
        (a trajectory larger than the broker takes, ...) dead-letters the task with the reason and commits past
        it, so its partition moves on; retries spent leave it uncommitted (redelivered to another actor)."""
        try:
            await retry_async(lambda: self._publish(traj), f"publishing trajectory {traj.episode_id}",
                              attempts=5, backoff_s=1.0, max_backoff_s=10.0)
        except Exception as exc:  # noqa: BLE001 - sorted by is_retriable below
            if is_retriable(exc):
                log.error("trajectory %s of task %s not published after retries; leaving the task uncommitted: %s",
                          traj.episode_id, traj.task_id, exc)
                return
            await self._refuse(rec, consumer, f"trajectory unpublishable (not retriable): {type(exc).__name__}: {exc}")
            return
        await self._commit_done(rec, consumer)

    async def _publish(self, traj: Trajectory) -> None:
        """One attempt to publish ``traj`` and wait for its ack."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, lambda: self.producer.send(
                T.TRAJECTORIES, traj, key=traj.task_id).get(timeout=60))
        except Exception:
            self.stats["publish_failures"] += 1
            raise
        self.stats["published"] += 1
        metrics.inc("trajectories_published")
        self.published_tasks.append(traj.task_id)


REMOTE_TOOLS = ("compile", "verify", "profile")


def _record_episode(traj: Trajectory, seconds: float) -> None:
    """Dashboard numbers of one finished episode (counters, reward histogram, tool latencies)."""
    metrics.inc("episodes_finished")
    metrics.inc("generated_tokens", float(traj.loss_mask.sum()))
    metrics.observe("episode_s", seconds)
    metrics.bucket("reward", float(traj.reward))
    for turn in traj.turns:
        if turn.tool_name in REMOTE_TOOLS:
            metrics.inc("tool_calls_sent")
            metrics.observe("tool_latency_s", turn.tool_latency_s, tool=turn.tool_name)


def _poll(consumer: Any, free: int) -> list:
    """Poll for at most ``free`` tasks; with no free slot, poll with every partition paused."""
    kc = consumer.kafka
    if free <= 0:
        todo = kc.assignment() - kc.paused()
        if todo:
            kc.pause(*todo)
    elif kc.paused():
        kc.resume(*kc.paused())
    recs = consumer.poll(timeout_s=0.2, max_records=max(1, free))
    if not recs:  # idle: task commits that failed (a broker killed under them) are sent again, as serve() does
        consumer.recommit_failed()
    return recs


def build_episode(cfg: Any, policy: Any, renderer: ChatRenderer, task: Task, client: Any, ws_root: Path,
                  actor_id: str, limits: EpisodeLimits, episode_id: str) -> Episode:
    """An episode in a fresh workspace (from the skills/ template and the task's model.py)."""
    acfg = cfg.actor
    ws = Workspace.create(ws_root, episode_id, task.model_py, task.backend, starter=limits.mode != "single_turn")
    local = LocalTools(ws.root, protected=ws.protected, bash_timeout_s=acfg.bash_timeout_s,
                       max_output_chars=acfg.max_observation_chars, isolation=cfg.sandbox.isolation,
                       tmp_mb=max(cfg.sandbox.sandbox_tmp_mb, 512))
    remote = RemoteTools(client, task, episode_id, ws, timeout_s=acfg.tool_timeout_s,
                         max_output_chars=acfg.max_observation_chars, cuda_arch=cfg.sandbox.cuda_arch)
    skill = single_turn_skill_text(task.backend) if limits.mode == "single_turn" else skill_text(task.backend)
    return Episode(policy, renderer, task, episode_id, actor_id, ws, local, remote, limits, skill)


async def run_episode(cfg: Any, policy: Any, renderer: ChatRenderer, task: Task, client: Any, ws_root: Path,
                      actor_id: str, limits: EpisodeLimits, episode_id: str | None = None) -> tuple[Trajectory, bool]:
    """Run one episode; returns (trajectory, whether it ended on an internal error)."""
    episode_id = episode_id or new_id()
    episode = await asyncio.to_thread(build_episode, cfg, policy, renderer, task, client, ws_root, actor_id,
                                      limits, episode_id)
    try:
        return await episode.run(), False
    except (PolicyFailure, asyncio.CancelledError):
        raise
    except Exception as exc:  # an episode bug ends that episode, not the actor
        if engine_dead(exc):  # not the episode's fault: leave the task uncommitted for another actor
            raise PolicyFailure(f"inference engine died: {exc}") from exc
        log.exception("episode %s failed", episode_id)
        traj = await episode._finish("error", final_eval=False)
        traj.metadata["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        return traj, True
    finally:
        if not cfg.actor.keep_workspaces:
            await asyncio.to_thread(episode.workspace.remove)
