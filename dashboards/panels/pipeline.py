"""The pipeline's own health, from what reaches Prometheus: window freshness, reporting series, late records,
the collectors' own telemetry (scraped as job "otelcol"), the Flink jobs' (their reporter: state, Kafka
backlog, checkpoints, restarts) and Kafka's per-topic rates (its JMX exporter, scraped as job "kafka").
"""

from __future__ import annotations

from infersight.dashboards import rules as R
from infersight.dashboards.common import (
    FLINK_CHECKPOINT_DURATION,
    FLINK_CHECKPOINTS_FAILED,
    FLINK_JOB_RUNNING,
    FLINK_PENDING_RECORDS,
    FLINK_RESTARTS,
    KAFKA_JOB,
    KAFKA_MESSAGES_IN,
    OTELCOL_ACCEPTED_SPANS,
    OTELCOL_JOB,
    OTELCOL_QUEUE_CAPACITY,
    OTELCOL_QUEUE_SIZE,
    OTELCOL_REFUSED_SPANS,
    OTELCOL_UP,
    REQUESTS,
    query,
    sel,
    stat_panel,
    thresholds,
    timeseries_panel,
)
from infersight.schemas import pipeline as P
from infersight.schemas.topics import DLQ

WINDOWS = P.prom(P.WINDOW_REQUESTS)
LATE = P.prom(P.LATE_RECORDS)
RG = sel(deployment=False)


def freshness():
    return timeseries_panel(
        "Freshness by region", "Now minus the end of the newest window in Prometheus; the line is the "
        f"InfersightPipelineStale bound ({R.FRESHNESS_BOUND_S} s).", "s",
        thresholds((None, "green"), (R.FRESHNESS_BOUND_S, "red")),
        query(f"time() - max by (region) (timestamp({WINDOWS}{RG}))", "{{region}}"))


def freshness_now():
    return stat_panel(
        "Freshness now", "Age of the newest window of any region.", "s",
        thresholds((None, "green"), (R.FRESHNESS_BOUND_S, "red")),
        query(f"time() - max(timestamp({WINDOWS}{RG}))", "freshness", instant=True))


def reporting_series():
    return timeseries_panel(
        "Series reporting by region", "Per-deployment series with a window in the last 2 minutes; a drop to "
        "0 fires InfersightRegionNoData.", "short", thresholds((None, "red"), (1, "green")),
        query(f"count by (region) (last_over_time({WINDOWS}{sel()}[2m]))", "{{region}}"), line=False)


def _requests_rate() -> str:
    return f"sum by (region) (rate({REQUESTS}{RG}[$__rate_interval]))"


def _late_rate() -> str:
    """Late records per second by region, 0 for a region with requests and none late (the metrics job writes the
    late counter from the first late record on)."""
    return f"sum by (region) (rate({LATE}{RG}[$__rate_interval]))\n  or 0 * {_requests_rate()}"


def late_records_rate():
    return timeseries_panel(
        "Late records by region", "Records that missed their window (sent to infersight.late), per second.",
        "reqps", thresholds((None, "green")),
        query(f"{_late_rate()}", "{{region}}"), line=False)


def late_ratio():
    return timeseries_panel(
        "Late share of requests", "Late records / requests; the line is the InfersightLateRecords bound.",
        "percentunit", thresholds((None, "green"), (R.LATE_RATIO_BOUND, "red")),
        query(f"({_late_rate()})\n  / {_requests_rate()}", "{{region}}"))


def detect_output_age():
    return stat_panel(
        "Detect job: last output", "Age of the detect job's newest incidents point (it writes once it has "
        "seen an anomaly; empty before).", "s", thresholds((None, "green"), (120, "red")),
        query(f"time() - max(timestamp({P.prom(P.OPEN_INCIDENTS)}))", "detect", instant=True))


COL = f'{{job="{OTELCOL_JOB}", region=~"$region|all"}}'


def collectors_up():
    return stat_panel(
        "Collectors up", "Whether Prometheus scrapes each collector's own telemetry (1 up, 0 down).", "bool",
        thresholds((None, "red"), (1, "green")),
        query(f"{OTELCOL_UP}{COL}", "{{collector}} {{region}}", instant=True))


def collector_queue_fill():
    return timeseries_panel(
        "Collector export queues", "Each exporter's sending queue, used / capacity (the gateways' Kafka "
        "exporters, the sink's remote write); full means the collector refuses data.", "percentunit",
        thresholds((None, "green"), (R.QUEUE_FILL_BOUND, "red")),
        query(f"max by (collector, region, exporter) ({OTELCOL_QUEUE_SIZE}{COL}\n"
              f"  / {OTELCOL_QUEUE_CAPACITY}{COL})", "{{region}} {{exporter}}"))


def gateway_spans():
    return timeseries_panel(
        "Gateway intake: spans accepted and refused", "Spans per second the gateways' receivers accepted and "
        "refused (refused: the pods' SDKs retry, then drop).", "short", thresholds((None, "green")),
        query(f"sum by (region) (rate({OTELCOL_ACCEPTED_SPANS}{COL}[$__rate_interval]))", "accepted {{region}}"),
        query(f"sum by (region) (rate({OTELCOL_REFUSED_SPANS}{COL}[$__rate_interval]))", "refused {{region}}",
              ref="B"), line=False)


def flink_jobs_running():
    return stat_panel(
        "Flink jobs running", "Per job, 1 while RUNNING (Flink's runningState); 0 or missing fires "
        "InfersightFlinkJobNotRunning.", "bool", thresholds((None, "red"), (1, "green")),
        query(f"max by (job_name) ({FLINK_JOB_RUNNING})", "{{job_name}}", instant=True))


def consumer_lag():
    return timeseries_panel(
        "Kafka backlog per job (consumer lag)", "Kafka messages each job's sources have yet to read "
        "(pendingRecords; a message is one export batch); the line is the InfersightConsumerLag bound.", "short",
        thresholds((None, "green"), (R.CONSUMER_LAG_BOUND, "red")),
        query(f"sum by (job_name) ({FLINK_PENDING_RECORDS})", "{{job_name}}"))


def checkpoint_duration():
    return timeseries_panel(
        "Checkpoint duration", "Each job's last checkpoint, start to acknowledged; its exactly-once output "
        "reaches readers only at checkpoints, so this adds to freshness.", "ms",
        thresholds((None, "green"), (10_000, "red")),
        query(f"max by (job_name) ({FLINK_CHECKPOINT_DURATION})", "{{job_name}}"))


def restarts_and_failed_checkpoints():
    return timeseries_panel(
        "Restarts and failed checkpoints", "Per job over the interval: restarts (a failover from the last "
        "checkpoint) and failed checkpoints.", "short", thresholds((None, "green"), (1, "red")),
        query(f"sum by (job_name) (increase({FLINK_RESTARTS}[$__rate_interval]))", "restarts {{job_name}}"),
        query(f"sum by (job_name) (increase({FLINK_CHECKPOINTS_FAILED}[$__rate_interval]))",
              "failed checkpoints {{job_name}}", ref="B"), line=False)


KAFKA = f'{{job="{KAFKA_JOB}"}}'


def dead_letters():
    return timeseries_panel(
        "Dead letters", f"Records per second into {DLQ.name} (every job's telemetry it could not read, with the "
        "reason); any fires InfersightDeadLetters.", "short", thresholds((None, "green"), (0.001, "red")),
        query(f'sum(rate({KAFKA_MESSAGES_IN}{{job="{KAFKA_JOB}", topic="{DLQ.name}"}}[$__rate_interval]))\n'
              f"  or 0 * sum(rate({KAFKA_MESSAGES_IN}{KAFKA}[$__rate_interval]))", "dead letters"))


def topic_intake():
    return timeseries_panel(
        "Kafka intake per topic", "Messages per second appended to each of the pipeline's topics (a message is a "
        "batch: an OTLP export, a window's records).", "short", thresholds((None, "green")),
        query(f'sum by (topic) (rate({KAFKA_MESSAGES_IN}{{job="{KAFKA_JOB}", topic=~"infersight.*"}}'
              "[$__rate_interval]))", "{{topic}}"), line=False)
