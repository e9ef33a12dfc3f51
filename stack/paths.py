"""Where set-up caches downloads and builds, and where stacks keep their state.

Everything lives outside the repository, under ``$INFERSIGHT_CACHE`` (default
``~/.cache/infersight``), so a fresh clone reuses what an earlier one fetched.
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path

KAFKA_VERSION = "4.4.0"
FLINK_KAFKA_CONNECTOR_VERSION = "5.0.0-2.2"
ZSTD_JNI_VERSION = "1.5.7-17"
OTELCOL_BUILDER_VERSION = "v0.165.0"
JMX_EXPORTER_VERSION = "1.0.1"  # as stack/pom.xml
MIRROR_KAFKA_VERSION = "4.3.1"  # MirrorMaker 2's classpath (stack/pom.xml's mirror.kafka.version)


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "infersight"
    return Path(os.environ.get("INFERSIGHT_CACHE", default))


def stacks_dir() -> Path:
    """Default parent of stack state folders (data, logs, pid state)."""
    return cache_dir() / "stacks"


def jars_dir() -> Path:
    return cache_dir() / "jars"


def kafka_classpath_dir() -> Path:
    return jars_dir() / "kafka"


def mirror_classpath_dir() -> Path:
    """MirrorMaker 2's own classpath (``connect-mirror`` and its runtime), apart from the broker's."""
    return jars_dir() / "mirror"


def jmx_exporter_agent() -> Path:
    return jars_dir() / "agents" / f"jmx_prometheus_javaagent-{JMX_EXPORTER_VERSION}.jar"


def flink_jars_dir() -> Path:
    return jars_dir() / "flink"


def flink_kafka_connector_jar() -> Path:
    return flink_jars_dir() / f"flink-sql-connector-kafka-{FLINK_KAFKA_CONNECTOR_VERSION}.jar"


def flink_job_jars() -> list[Path]:
    """Jars every job ships: the Kafka connector, the zstd codec it leaves out, and our watermark strategy."""
    return [flink_kafka_connector_jar(), flink_jars_dir() / f"zstd-jni-{ZSTD_JNI_VERSION}.jar", watermarks_jar()]


def watermarks_source() -> Path:
    """The jobs' one piece of Java (``flink_jobs.common.kafka_io.event_time``), compiled by set-up."""
    return resource("infersight.flink_jobs.common", "java/io/infersight/flink/QuietWatermarks.java")


def watermarks_jar() -> Path:
    """Named by the source's digest: an edited source builds a new jar, never runs a stale one."""
    import hashlib

    digest = hashlib.sha256(watermarks_source().read_bytes()).hexdigest()[:12]
    return flink_jars_dir() / f"infersight-watermarks-{digest}.jar"


def go_dir() -> Path:
    return cache_dir() / "go"


def otelcol_binary() -> Path:
    return cache_dir() / "otelcol" / "otelcol-infersight"


def prometheus_dir() -> Path:
    return cache_dir() / "prometheus"


def alertmanager_dir() -> Path:
    return cache_dir() / "alertmanager"


def resource(package: str, name: str) -> Path:
    """A file shipped inside an infersight package (configs, manifests)."""
    return Path(str(resources.files(package).joinpath(name)))


def collector_config(name: str) -> Path:
    return resource("infersight.collectors", name)


def stack_config(name: str) -> Path:
    return resource("infersight.stack", f"config/{name}")


def venv_python() -> Path:
    """The interpreter Flink's Python workers must use (ours, with pyflink installed)."""
    return Path(sys.executable)


def pyflink_home() -> Path:
    """The Flink distribution that the apache-flink wheel carries."""
    import pyflink

    return Path(pyflink.__file__).parent
