"""The learner role's loop: read trajectories from Kafka, train, checkpoint, publish weights, log steps.

Exactly-once: rank 0 reads the trajectories topic with a manually assigned
consumer that seeks to the positions saved in the last checkpoint (the group's
committed offsets are written only for lag dashboards, never read). A step's
episodes and the positions after them enter the same checkpoint; the step's
TrainStep record and its weights are published after that checkpoint, and
re-published on restart if the crash came in between (the TrainStep only when
the learner log does not hold it yet).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from cluster import metrics
from learner import checkpoint as ckpt
from learner import engine as eng
from learner.ingest import Ingest
from learner.stages import Schedule
from schemas import topics
from schemas.messages import TrainStep, Trajectory

log = logging.getLogger(__name__)

GROUP = "learner"
GROUP_COMMIT_TIMEOUT_MS = 10_000  # a group commit waits this long for the coordinator, then is sent again later


class LearnerRole:
    def __init__(self, cfg, model_path: str, ckpt_dir: str, bus=None) -> None:
        from learner.publish import Publisher
        from learner.trainer import Trainer

        self.cfg = cfg
        self.model_path = model_path
        self.ckpt_dir = ckpt_dir
        self.rank, self.world = eng.rank_world()
        self.trainer = Trainer(cfg, model_path)
        state = ckpt.load(self.trainer, ckpt_dir) or {}
        self.step = int(state.get("step", 0))
        self.version = int(state.get("policy_version", 0))
        self.schedule = Schedule.from_config(cfg.learner)
        self.ingest = Ingest.from_state(self.schedule.at(self.step).stage, cfg.learner.max_staleness,
                                        state.get("ingest"))
        self._enter_stage()
        self.ingest.seen.limit = cfg.learner.seen_ids_limit
        self.ingest.vocab_size = int(getattr(self.trainer.policy_module().config, "vocab_size", 0) or 0)
        self._undetermined_counted = self.ingest.skipped_undetermined  # this process's counter starts here
        self._pending = state.get("pending")  # publish/log work of the last checkpointed step
        self._since_ckpt: dict[str, list[str]] = {"episode_ids": [], "dropped_stale": []}
        self.bus = bus
        self.producer = self.consumer = None
        if self.rank == 0 and bus is not None:
            self.producer = bus.producer(linger_ms=5)
            self.consumer = self._open_consumer()
        self.publisher = Publisher(cfg, self.producer)

    def _enter_stage(self) -> None:
        """Objective, learning rate and filters of the stage the next step belongs to (the schedule's)."""
        plan = self.schedule.at(self.step)
        if plan.stage != self.ingest.stage:
            self.ingest.set_stage(plan.stage)
        self.trainer.set_stage(plan.stage, self.schedule.lr_at(self.step))

    @property
    def stage(self) -> str:
        return self.trainer.stage

    # ---- Kafka ---------------------------------------------------------------------------
    def _open_consumer(self):
        from kafka import TopicPartition

        full = self.bus.topic(topics.TRAJECTORIES)
        parts = _topic_partitions(self.bus, topics.TRAJECTORIES)
        cons = self.bus.consumer([topics.TRAJECTORIES], self.bus.group(GROUP), assign=[(topics.TRAJECTORIES, p) for p in parts],
                                 expected=Trajectory)
        for p in parts:
            tp = TopicPartition(full, p)
            if p in self.ingest.positions:
                cons.kafka.seek(tp, self.ingest.positions[p])
            else:
                cons.kafka.seek_to_beginning(tp)
        log.info("reading %s partitions %s from %s", full, parts, self.ingest.positions or "the beginning")
        return cons

    def _fill(self, want: int, deadline: float, stop: threading.Event) -> None:
        while self.ingest.ready() < want and time.monotonic() < deadline and not stop.is_set():
            recs = self.consumer.poll(timeout_s=0.2)
            if not recs:  # idle: a group commit that failed is sent again (the bus consumer kept it)
                self.consumer.recommit_failed()
            for rec in recs:
                self.ingest.offer(rec.msg, rec.partition, rec.offset)
                metrics.inc("learner_trajectories_received")
                self._dead_letter_rejected(rec)

    def _dead_letter_rejected(self, rec) -> None:
        """An invalid trajectory goes to the dead-letter topic with the reason, once: it is dropped (its offset
        consumed) rather than trained on, so the learner never crash-loops on it."""
        from schemas import codec

        while self.ingest.rejected:
            part, off, why = self.ingest.rejected.pop(0)
            payload = codec.encode(rec.msg) if (part, off) == (rec.partition, rec.offset) else b""
            # the full topic name, as the consumers' and workers' letters carry (the report matches on it)
            self.bus.dead_letter(rec.raw_topic or self.bus.topic(topics.TRAJECTORIES), part, off,
                                 f"invalid trajectory: {why}", payload, consumer="learner")
            metrics.inc("learner_trajectories_dead_lettered")

    def _commit_group(self) -> None:
        """Mirror the checkpointed positions into the group: lag dashboards, and the task feeder's gate on the
        trajectory backlog (cluster/launch/run_loop.py), which reads that lag. A failed commit (the coordinator
        killed under it) is kept by the bus consumer and sent again while the learner waits for trajectories
        (``_fill``): left lost, the gate could stay shut and no episode would come."""
        from cluster.bus.client import BusError

        try:
            self.consumer.commit_positions(topics.TRAJECTORIES, dict(self.ingest.positions),
                                           timeout_ms=GROUP_COMMIT_TIMEOUT_MS)
        except BusError as exc:  # never fail a step for it: sent again while waiting
            log.warning("group commit failed (sent again while waiting for trajectories): %s", exc)

    # ---- the loop ------------------------------------------------------------------------
    def next_batch(self, stop: threading.Event, wait_s: float) -> list | None:
        """Rank 0 gathers the next batch and broadcasts it; None = stop (all ranks agree)."""
        samples = None
        if self.rank == 0:
            n = self.cfg.learner.batch_trajectories
            deadline = time.monotonic() + wait_s
            while not stop.is_set():
                self._fill(n, deadline, stop)
                before = dict(self.ingest.positions)
                samples = self.ingest.take(n, self.version)
                if not samples and self.ingest.positions != before and self.consumer is not None:
                    # records dropped without a step (stale ones): their lag must fall now, or the task feeder's
                    # gate, which reads it, stays shut and no fresh episode ever comes (a deadlock)
                    self._commit_group()
                self._count_undetermined()
                if samples or time.monotonic() >= deadline:
                    break
            if stop.is_set():
                samples = None
        return eng.broadcast_object({"samples": samples})["samples"]

    def _count_undetermined(self) -> None:
        """Trajectories skipped for an undetermined reward since the last call -> the metrics counter."""
        n = self.ingest.skipped_undetermined
        if n > self._undetermined_counted:
            metrics.inc("trajectories_skipped_undetermined", n - self._undetermined_counted)
            self._undetermined_counted = n

    def run(self, max_steps: int = 0, stop: threading.Event | None = None, idle_wait_s: float = 3600.0) -> int:
        stop = stop or threading.Event()
        max_steps = max_steps or self.schedule.total_steps
        if self.schedule.plans:
            log.info("stage schedule: %s (now at step %d: %s)", self.schedule.describe(), self.step, self.stage)
        self._redo_pending(resumed=True)
        done = 0
        while not max_steps or self.step < max_steps:
            samples = self.next_batch(stop, idle_wait_s)
            if samples is None:
                break
            if not samples:
                continue
            self.train_one(samples)
            done += 1
        return done

    def train_one(self, samples: list) -> dict:
        lc = self.cfg.learner
        stage = self.stage
        for s in samples:  # 0: every generated token came from the weights the learner holds now
            s.flags["lag"] = self.version - s.min_version
        m = self.trainer.step(samples)
        m["stage"] = stage
        self.step += 1
        publish = self.step % lc.publish_every == 0
        if publish:
            self.version += 1
        m["staleness_hist"] = {str(k): v for k, v in sorted(self.ingest.staleness.items())}
        m["dropped"] = dict(self.ingest.dropped)
        m["trajectories_skipped_undetermined"] = self.ingest.skipped_undetermined  # cumulative, checkpointed
        m["policy_version"] = self.version
        self._since_ckpt["episode_ids"] += [s.episode_id for s in samples]
        self._since_ckpt["dropped_stale"] += self.ingest.drain_stale()
        if self.step % lc.checkpoint_every == 0 or publish:
            pending = {"step": self.step, "version": self.version if publish else None, "metrics": m,
                       "stage": stage, **self._since_ckpt}
            self.checkpoint(pending)
            self._since_ckpt = {"episode_ids": [], "dropped_stale": []}
            self._redo_pending(resumed=False)
        self._record(m)
        self._enter_stage()
        return m

    def checkpoint(self, pending: dict | None) -> None:
        state = {"step": self.step, "stage": self.schedule.at(self.step).stage, "policy_version": self.version,
                 "ingest": self.ingest.state(), "pending": pending}
        self._pending = pending
        ckpt.save(self.trainer, self.ckpt_dir, self.step, state, keep=self.cfg.learner.keep_checkpoints)
        if self.rank == 0 and self.consumer is not None:
            self._commit_group()

    def _redo_pending(self, resumed: bool) -> None:
        """Publish weights / the TrainStep of the last checkpointed step (idempotent for receivers).

        After a restart (``resumed``) the TrainStep is sent only if the learner log does not hold it yet."""
        p, self._pending = self._pending, None
        if not p:
            return
        if p.get("version") and p["version"] == self.version:
            ann, secs = self.publisher.publish(self.trainer.policy_module(), p["version"], p["step"],
                                               self.model_path)
            metrics.observe("learner_publish_s", secs)
            metrics.set_gauge("learner_policy_version", p["version"])
        if self.rank == 0 and self.producer is not None and not (resumed and self._logged(p["step"])):
            nums = {k: v for k, v in p["metrics"].items() if k != "stage"}
            rec = TrainStep(step=p["step"], policy_version=self.version, stage=p.get("stage", self.stage),
                            episode_ids=p["episode_ids"], metrics=nums, dropped_stale=p["dropped_stale"])
            self.producer.send(topics.LEARNER_LOG, rec, key="learner").get(timeout=60)

    def _logged(self, step: int) -> bool:
        """Whether the learner log already holds this step (only each partition's last record is read)."""
        parts = _topic_partitions(self.bus, topics.LEARNER_LOG)
        probe = self.bus.consumer([topics.LEARNER_LOG], None, assign=[(topics.LEARNER_LOG, p) for p in parts],
                                  expected=TrainStep, dlq=False)
        try:
            tps = list(probe.kafka.assignment())
            ends = probe.kafka.end_offsets(tps)
            waiting = {tp.partition for tp, end in ends.items() if end > 0}
            for tp, end in ends.items():
                if end > 0:
                    probe.kafka.seek(tp, end - 1)
            last, deadline = -1, time.monotonic() + 15
            while waiting and time.monotonic() < deadline:
                for rec in probe.poll(timeout_s=0.5):
                    last = max(last, rec.msg.step)
                    waiting.discard(rec.partition)
            return last >= step
        finally:
            probe.close()

    def _record(self, m: dict) -> None:
        metrics.inc("learner_steps")
        metrics.inc("learner_tokens", m.get("tokens", 0.0))
        metrics.inc("trajectories_trained", m.get("trajectories", 0.0))
        # the names `kernelrl up`'s dashboard reads
        metrics.set_gauge("learner_step", self.step)
        metrics.set_gauge("policy_version", self.version)
        metrics.set_gauge("loss", next((m[k] for k in ("policy_loss", "loss", "value_loss") if k in m), 0.0))
        for k, v in m.items():
            if isinstance(v, (int, float)):
                metrics.set_gauge(f"learner_{k}", v)
        for reason, n in self.ingest.dropped.items():
            metrics.set_gauge("learner_dropped", n, reason=reason)
        log.info("step %d v%d: %s", self.step, self.version,
                 {k: round(v, 4) for k, v in m.items() if isinstance(v, float)})

    def close(self) -> None:
        self.publisher.close()
        for c in (self.consumer, self.producer):
            if c is not None:
                c.close()


def _topic_partitions(bus, topic: str) -> list[int]:
    """Partitions of a topic from the cluster's metadata; a clear error when the topic is missing."""
    from cluster.errors import RetriableError

    probe = bus.consumer([], None, assign=[], dlq=False)
    try:
        parts = probe.kafka.partitions_for_topic(bus.topic(topic))
    finally:
        probe.close()
    if not parts:
        raise RetriableError(f"topic {bus.topic(topic)!r} does not exist: create kernelrl's topics first "
                             "(`kernelrl topics create`, or `kernelrl up` does it)")
    return sorted(parts)


def default_ckpt_dir(cfg) -> str:
    """learner.checkpoint_dir, else <cache>/learner-ckpt/<topic prefix>: checkpoints hold Kafka positions,
    so they belong to one set of topics (each isolated `kernelrl up` run gets its own)."""
    from cluster.config import run_cache_path

    return cfg.learner.checkpoint_dir or str(run_cache_path(cfg, "learner-ckpt"))


def model_path_for(cfg) -> str:
    from cluster.models.importer import resolve_model_path  # a named built-in ("smollm2", "tiny") -> its folder

    path = resolve_model_path(cfg, cfg.learner.model_path or cfg.actor.model_path)
    if path:
        return path
    from cluster.models.tiny import build_tiny_model, default_tiny_model_dir

    return build_tiny_model(default_tiny_model_dir(cfg))


def ensure_dir(path: str) -> str:
    Path(path).mkdir(parents=True, exist_ok=True)
    return path
