"""Fetch the embedded broker's jars once from Maven Central (pinned Kafka version).

A generated pom under ``<cache_dir>/kafka-<version>/`` and ``mvn dependency:copy-dependencies``
put the runtime jars in ``libs/``; a marker holding the pom marks them complete, so a
changed pom (version, logging deps) refetches. Clear SetupErrors when Java or Maven is missing.
MirrorMaker 2 (``org.apache.kafka:connect-mirror``, same pinned version) is a second, optional set,
fetched only on demand (``fetch_mirror``, `kernelrl broker fetch --mirror`) into ``mirror/libs/``
with its own marker; the broker's set is not touched by it.
"""
from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from cluster.errors import RetriableError, SetupError

log = logging.getLogger(__name__)

_MARKER = ".complete"
_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kernelrl</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId>
      <artifactId>slf4j-api</artifactId>
      <version>2.0.17</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j2-impl</artifactId>
      <version>2.24.3</version>
    </dependency>
  </dependencies>
</project>
"""
# connect-mirror pulls connect-runtime, connect-mirror-client, connect-json, connect-transforms, kafka-clients
_MIRROR_POM = _POM.replace("<artifactId>kafka-runtime</artifactId>", "<artifactId>kafka-mirror-runtime</artifactId>") \
    .replace("<artifactId>kafka_{scala}</artifactId>", "<artifactId>connect-mirror</artifactId>")


def kafka_home(cfg) -> Path:
    return Path(cfg.broker.cache_dir).expanduser() / f"kafka-{cfg.broker.kafka_version}"


def _require(tool: str, what: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise SetupError(
            f"'{tool}' not found: the embedded Kafka broker needs {what} "
            "(Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless maven). "
            "Or use an existing Kafka cluster: set bus.bootstrap_servers "
            "(KRL__BUS__BOOTSTRAP_SERVERS=host:9092).")
    return path


def _check_java(java: str) -> None:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    text = (out.stderr or out.stdout).strip()
    try:
        first = text.split('"')[1]
        major = int(first.split(".")[0]) if not first.startswith("1.") else int(first.split(".")[1])
    except (IndexError, ValueError):
        log.warning("could not parse the Java version from %r", text[:200])
        return
    if major < 17:
        raise SetupError(f"Java {major} found ({java}); Kafka 4.x needs Java 17+ "
                         "(apt-get install -y openjdk-17-jre-headless)")


def _pom(cfg) -> str:
    return _POM.format(scala=cfg.broker.scala_version, version=cfg.broker.kafka_version)


def _mirror_pom(cfg) -> str:
    return _MIRROR_POM.format(version=cfg.broker.kafka_version)


def mirror_home(cfg) -> Path:
    return kafka_home(cfg) / "mirror"


def _complete(libs: Path, pom: str) -> bool:
    try:
        return (libs / _MARKER).read_text() == pom
    except OSError:
        return False


def fetched(cfg) -> bool:
    """True when the jars of exactly this pom are in place."""
    return _complete(kafka_home(cfg) / "libs", _pom(cfg))


def mirror_fetched(cfg) -> bool:
    return _complete(mirror_home(cfg) / "libs", _mirror_pom(cfg))


def fetch(cfg, quiet: bool = True) -> Path:
    """Download the broker's runtime jars once; a no-op when they are present."""
    return _fetch_set(kafka_home(cfg), _pom(cfg), "kafka_*.jar",
                      f"org.apache.kafka:kafka_{cfg.broker.scala_version}:{cfg.broker.kafka_version}", quiet)


def fetch_mirror(cfg, quiet: bool = True) -> Path:
    """Download MirrorMaker 2's runtime jars (connect-mirror and its Connect runtime) once, on demand."""
    return _fetch_set(mirror_home(cfg), _mirror_pom(cfg), "connect-mirror-[0-9]*.jar",
                      f"org.apache.kafka:connect-mirror:{cfg.broker.kafka_version}", quiet)


def _fetch_set(home: Path, pom: str, expect: str, what: str, quiet: bool) -> Path:
    """``mvn dependency:copy-dependencies`` of ``pom`` into ``home/libs``, marked complete by the pom."""
    libs = home / "libs"
    if _complete(libs, pom):
        return libs
    _check_java(_require("java", "Java 17+"))
    mvn = _require("mvn", "Maven (to fetch the Kafka jars from Maven Central)")
    home.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(libs, ignore_errors=True)  # no stale jars from another pom
    (home / "pom.xml").write_text(pom)
    cmd = [mvn, "-B", "dependency:copy-dependencies", f"-DoutputDirectory={libs}",
           "-DincludeScope=runtime"]
    if quiet:
        cmd.insert(1, "-q")
    log.info("fetching %s jars into %s", what, libs)
    proc = subprocess.run(cmd, cwd=home, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RetriableError(f"mvn could not fetch {what} (network? version?):\n{tail}")
    if not any(libs.glob(expect)):
        raise SetupError(f"mvn finished but no {expect} is in {libs}")
    (libs / _MARKER).write_text(pom)
    return libs
