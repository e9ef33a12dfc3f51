"""Flink configuration for infersight's session cluster, shared by the native stack and the
container image: pyflink's own config.yaml (JVM module flags and all), our base settings from
``stack/config/flink/config.yaml``, then per-deployment overrides (addresses, ports, folders)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from infersight.stack import paths


def flatten_yaml(tree: dict, prefix: str = "") -> dict:
    """Nested YAML keys -> Flink's dotted keys (Flink reads both; one style avoids duplicates)."""
    flat: dict = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten_yaml(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def write_conf(conf_dir: Path, overrides: dict[str, Any]) -> Path:
    """A private conf folder: pyflink's files with the merged config.yaml; returns its path."""
    if conf_dir.exists():
        shutil.rmtree(conf_dir)
    shutil.copytree(paths.pyflink_home() / "conf", conf_dir)
    settings = flatten_yaml(yaml.safe_load((conf_dir / "config.yaml").read_text()) or {})
    settings.update(flatten_yaml(yaml.safe_load(paths.stack_config("flink/config.yaml").read_text())))
    settings.update({
        "python.executable": str(paths.venv_python()),
        "python.client.executable": str(paths.venv_python()),
        **overrides,
    })
    (conf_dir / "config.yaml").write_text(yaml.safe_dump(settings, sort_keys=True, width=100_000))
    return conf_dir


# What the pipeline-health dashboard and alerts read of Flink's own metrics (the reporter sends only these):
# restarts, checkpoints and job state per job; per operator the Kafka source's backlog (consumer lag), record
# rates and our jobs' own counters (dead letters, late and folded records).
REPORTED_METRICS = [
    "jobmanager.job:numRestarts,lastCheckpointDuration,lastCheckpointSize,numberOfFailedCheckpoints,"
    "numberOfCompletedCheckpoints,*State",
    "taskmanager.job.task.operator:pendingRecords,numRecordsIn,numRecordsOut,dead_letters,late_gauges,late_records,"
    "folded_*",
]


def metrics_reporter(otlp_endpoint: str) -> dict[str, Any]:
    """Flink's OpenTelemetry metric reporter (a plugin in the wheel's plugins/), pushing to the sink collector's
    OTLP receiver, which writes to Prometheus. Not the Prometheus reporter: Flink 2.2's binds every interface
    (no host option), and our stacks listen on loopback only."""
    return {
        "metrics.reporter.otel.factory.class": "org.apache.flink.metrics.otel.OpenTelemetryMetricReporterFactory",
        "metrics.reporter.otel.exporter.endpoint": otlp_endpoint,
        "metrics.reporter.otel.exporter.protocol": "gRPC",
        "metrics.reporter.otel.interval": "15 s",
        "metrics.reporter.otel.service.name": "flink",
        "metrics.reporter.otel.filter.includes": ";".join(REPORTED_METRICS),
        # the job state as gauges (runningState = 1 while RUNNING): "job not running" alerts on it
        "metrics.job.status.enable": "STATE",
    }


def container_overrides(rpc_address: str, data_dir: Path, metrics_otlp: str = "http://sink:4317") -> dict[str, Any]:
    """Settings for a Flink node in a container (docker-compose): listen on all interfaces."""
    return {
        **metrics_reporter(metrics_otlp),
        "jobmanager.rpc.address": rpc_address,
        "jobmanager.bind-host": "0.0.0.0",
        "taskmanager.bind-host": "0.0.0.0",
        "rest.address": rpc_address,
        "rest.bind-address": "0.0.0.0",
        "execution.checkpointing.dir": (data_dir / "checkpoints").as_uri(),
        "execution.checkpointing.savepoint-dir": (data_dir / "savepoints").as_uri(),
    }
