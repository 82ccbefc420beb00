"""The broker's classpath: Apache Kafka's jars from Maven Central, fetched once per machine into
a per-user cache (docs/kafka-local.md §Jars), and the ``java`` they run on.

Environment: ``REWARDSTREAM_CACHE_DIR`` (default ``~/.cache/rewardstream``) holds the jars;
``KAFKA_LIBS_DIR`` overrides the jar directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from rewardstream.kafka.local.errors import KafkaLocalError, require, tail

__all__ = ["KAFKA_VERSION", "cache_dir", "fetch_jars", "libs_dir", "require_java"]

KAFKA_VERSION = "4.3.1"
POM = Path(__file__).parents[2] / "kafka-local" / "pom.xml"  # shipped as package data

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Per-user cache, so the 44 MB of jars are downloaded once per machine, not per run."""
    env = os.environ.get("REWARDSTREAM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rewardstream"


def libs_dir() -> Path:
    """Directory holding the broker classpath; ``KAFKA_LIBS_DIR`` lets CI share one copy."""
    env = os.environ.get("KAFKA_LIBS_DIR")
    return Path(env).expanduser() if env else cache_dir() / f"kafka-{KAFKA_VERSION}" / "libs"


def require_java() -> str:
    """The ``java`` on PATH that runs the broker and its tools."""
    return require("java", "install a JDK >= 17 (Kafka 4.x brokers need it)")


def _has_jars(directory: Path) -> bool:
    return any(directory.glob("kafka_2.13-*.jar"))


def fetch_jars() -> Path:
    """Return the libs dir, downloading the jars with Maven first if they are not there yet.

    Maven writes into a temporary sibling directory that is renamed into place only on success,
    so an interrupted download never leaves a half-filled cache behind.
    """
    target = libs_dir()
    if _has_jars(target):
        return target
    if not POM.is_file():
        raise KafkaLocalError(f"pom not found at {POM}; cannot resolve the Kafka jars")
    hint = "install Maven 3, or set KAFKA_LIBS_DIR to a directory with the Kafka jars"
    mvn = require("mvn", hint)
    require_java()
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}-partial-*"):  # left by a killed download
        if time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-partial-", dir=target.parent))
    try:
        log.info("fetching Kafka %s jars with Maven into %s", KAFKA_VERSION, target)
        started = time.monotonic()
        cmd = [mvn, "-B", "-q", "-f", str(POM), "dependency:copy-dependencies"]
        cmd += ["-DincludeScope=runtime", f"-DoutputDirectory={tmp}"]
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 or not _has_jars(tmp):
            raise KafkaLocalError(
                f"Maven could not fetch the Kafka jars (exit {proc.returncode}):\n"
                + tail(proc.stdout + proc.stderr)
            )
        try:
            tmp.rename(target)
        except OSError:
            if not _has_jars(target):  # not a lost race with another fetch: a real error
                raise
        jars = list(target.glob("*.jar"))
        size_mb = sum(j.stat().st_size for j in jars) / 1e6
        log.info(
            "fetched %d jars (%.0f MB) in %.1fs", len(jars), size_mb, time.monotonic() - started
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
