"""The pipeline itself: freshness, series reporting, late records, the detect job's output, the collectors,
the Flink jobs, Kafka's topics."""

from __future__ import annotations

from infersight.dashboards.common import compose, dashboard, variables
from infersight.dashboards.panels import pipeline

UID = "infersight-pipeline"


def build():
    dash = dashboard(UID, "infersight / Pipeline health", "Whether the pipeline's numbers are fresh and "
                     "complete; the collectors', the Flink jobs' and Kafka's own telemetry.", ["pipeline"])
    for v in variables(names=("region",)):
        dash = dash.with_variable(v)
    return compose(dash, [
        ("Freshness", [pipeline.freshness_now(), pipeline.detect_output_age(), pipeline.freshness(),
                       pipeline.reporting_series()]),
        ("Late records", [pipeline.late_records_rate(), pipeline.late_ratio()]),
        ("Collectors", [pipeline.collectors_up(), pipeline.collector_queue_fill(), pipeline.gateway_spans()]),
        ("Flink jobs", [pipeline.flink_jobs_running(), pipeline.consumer_lag(), pipeline.checkpoint_duration(),
                        pipeline.restarts_and_failed_checkpoints()]),
        ("Kafka", [pipeline.dead_letters(), pipeline.topic_intake()]),
    ])
