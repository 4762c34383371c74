"""MirrorMaker 2 from one Kafka cluster to another (dedicated mode): its properties, start and stop.

Jars: ``cluster.broker.fetch.fetch_mirror`` (``org.apache.kafka:connect-mirror``, the broker's pinned version).
``mm2_properties`` mirrors kernelrl's topics (``MIRRORED``: tasks, trajectories, the weight announcements
and the weight chunks, the learner log) one way, source -> target, with the
``IdentityReplicationPolicy``: a mirrored topic keeps its name, so the roles of the other cluster need no
per-cluster config (the default policy would rename ``krl.tasks`` to ``<source>.krl.tasks``, which no role
reads). The identity policy cannot mirror a topic both ways; one direction per topic, as in
cluster/deploy/mirrormaker/mm2.properties. Partitions and record timestamps are kept, offsets are not
(hence the offset-free weight URI, cluster/weights/transport.py). MM2's own topics (offset syncs, Connect's
config/offset/status, heartbeats) all live on the target, so the source is only read.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.broker.fetch import _require, fetch_mirror
from cluster.errors import SetupError
from cluster.launch.procs import die_with_parent
from schemas import topics as T

log = logging.getLogger(__name__)

MAIN_CLASS = "org.apache.kafka.connect.mirror.MirrorMaker"
MIRRORED = (T.TASKS, T.TRAJECTORIES, T.WEIGHTS, T.WEIGHTS_CHUNKS, T.LEARNER_LOG)
_LOG4J2 = """status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.mirror.name = org.apache.kafka.connect.mirror
logger.mirror.level = INFO
"""


def topics_regex(cfg, names=MIRRORED) -> str:
    """MM2's ``topics`` value: the full (prefixed) names, each a regex matching exactly that topic."""
    return ", ".join(re.escape(cfg.topic(n)) for n in names)


def mm2_properties(cfg, source_bootstrap: str, target_bootstrap: str, source: str = "A", target: str = "B",
                   names=MIRRORED, replication_factor: int = 1, interval_s: int = 5) -> str:
    """Properties of a one-way ``source -> target`` mirror of kernelrl's topics (``interval_s``: how often
    MM2 looks for new topics and syncs configs; 1 in tests)."""
    big = cfg.bus.max_message_bytes + 1024 * 1024  # a full-size record plus its batch overhead
    flow = f"{source}->{target}"
    props = {
        "clusters": f"{source}, {target}",
        f"{source}.bootstrap.servers": source_bootstrap,
        f"{target}.bootstrap.servers": target_bootstrap,
        f"{flow}.enabled": "true",
        f"{flow}.topics": topics_regex(cfg, names),
        f"{target}->{source}.enabled": "false",
        "replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        "tasks.max": "1",
        "sync.topic.configs.enabled": "true",
        "sync.topic.acls.enabled": "false",  # kernelrl sets no ACLs; the embedded broker has no authorizer
        "emit.checkpoints.enabled": "false",  # consumer groups are per cluster: actors there have their own
        "sync.group.offsets.enabled": "false",
        "emit.heartbeats.enabled": "true",
        "offset-syncs.topic.location": "target",  # the source is only read
        "refresh.topics.interval.seconds": str(interval_s),
        "sync.topic.configs.interval.seconds": str(interval_s),
        "emit.heartbeats.interval.seconds": str(interval_s),
        "offset.flush.interval.ms": str(interval_s * 1000),
        f"{target}.producer.max.request.size": str(big),
        f"{source}.consumer.max.partition.fetch.bytes": str(big),
        f"{source}.consumer.fetch.max.bytes": str(big),
    }
    for rf in ("replication.factor", "offset-syncs.topic.replication.factor", "heartbeats.topic.replication.factor",
               "checkpoints.topic.replication.factor", "config.storage.replication.factor",
               "offset.storage.replication.factor", "status.storage.replication.factor"):
        props[rf] = str(replication_factor)
    return "".join(f"{k} = {v}\n" for k, v in props.items())


@dataclass
class Mirror:
    """A running MirrorMaker 2 process and its folder (``mm2.properties``, ``mirror.log``)."""

    proc: subprocess.Popen
    folder: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join((self.folder / "mirror.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = 20.0) -> bool:
        """SIGTERM (Connect stops its tasks and commits), SIGKILL after ``timeout_s``; True if it exited cleanly."""
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            if self.proc.poll() is not None:
                return sig == signal.SIGTERM
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(wait_s)
                return sig == signal.SIGTERM
            except subprocess.TimeoutExpired:
                log.warning("MirrorMaker pid %d ignored %s for %.0fs", self.proc.pid, sig.name, wait_s)
        return False


def start(cfg, source_bootstrap: str, target_bootstrap: str, folder: str | os.PathLike, heap_mb: int = 384,
          tie_to_parent: bool = True, **props) -> Mirror:
    """Write ``mm2.properties`` into ``folder`` and start MirrorMaker 2 on it (jars fetched on first use).
    Returns once the JVM runs; records flow a few seconds later (the caller waits for what it needs)."""
    java = _require("java", "Java 17+")
    libs = fetch_mirror(cfg)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "mm2.properties"
    conf.write_text(mm2_properties(cfg, source_bootstrap, target_bootstrap, **props))
    (folder / "log4j2.properties").write_text(_LOG4J2)
    jit_gc = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"] if cfg.broker.fast_start else ["-XX:+UseG1GC"]
    cmd = [java, f"-Xmx{heap_mb}m", *jit_gc, "-Djava.awt.headless=true", "-XX:+ExitOnOutOfMemoryError",
           f"-Dlog4j2.configurationFile={folder / 'log4j2.properties'}", "-cp", str(libs / "*"), MAIN_CLASS, str(conf)]
    with open(folder / "mirror.log", "ab") as out, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(cmd, stdin=devnull, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                start_new_session=True, preexec_fn=die_with_parent if tie_to_parent else None)
    mirror = Mirror(proc, folder)
    time.sleep(0.5)
    if not mirror.alive():
        raise SetupError(f"MirrorMaker exited with code {proc.returncode} at start; log:\n{mirror.log_tail()}")
    log.info("MirrorMaker 2 (pid %d) mirroring %s -> %s", proc.pid, source_bootstrap, target_bootstrap)
    return mirror
