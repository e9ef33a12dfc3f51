"""The pipeline itself: freshness, series reporting, late records, the detect job's output, the collectors."""

from __future__ import annotations

from infersight.dashboards.common import compose, dashboard, variables
from infersight.dashboards.panels import pipeline

UID = "infersight-pipeline"


def build():
    dash = dashboard(UID, "infersight / Pipeline health", "Whether the pipeline's numbers are fresh and "
                     "complete, and the collectors' own telemetry. Kafka's and Flink's are not in this "
                     "Prometheus yet.", ["pipeline"])
    for v in variables(names=("region",)):
        dash = dash.with_variable(v)
    return compose(dash, [
        ("Freshness", [pipeline.freshness_now(), pipeline.detect_output_age(), pipeline.freshness(),
                       pipeline.reporting_series()]),
        ("Late records", [pipeline.late_records_rate(), pipeline.late_ratio()]),
        ("Collectors", [pipeline.collectors_up(), pipeline.collector_queue_fill(), pipeline.gateway_spans()]),
    ])
