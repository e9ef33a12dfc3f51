"""The pipeline's own health, from what reaches Prometheus: window freshness, reporting series, late records.

The collectors' and Flink's own telemetry (queue sizes, export failures, checkpoints, dead letters) is not
scraped into this Prometheus yet (everything arrives by remote write), so no panel reads it.
"""

from __future__ import annotations

from infersight.dashboards import rules as R
from infersight.dashboards.common import REQUESTS, query, sel, stat_panel, thresholds, timeseries_panel
from infersight.schemas import pipeline as P

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


def late_records_rate():
    return timeseries_panel(
        "Late records by region", "Records that missed their window (sent to infersight.late), per second.",
        "reqps", thresholds((None, "green")),
        query(f"sum by (region) (rate({LATE}{RG}[$__rate_interval]))", "{{region}}"), line=False)


def late_ratio():
    return timeseries_panel(
        "Late share of requests", "Late records / requests; the line is the InfersightLateRecords bound.",
        "percentunit", thresholds((None, "green"), (R.LATE_RATIO_BOUND, "red")),
        query(f"sum by (region) (rate({LATE}{RG}[$__rate_interval]))\n"
              f"  / sum by (region) (rate({REQUESTS}{RG}[$__rate_interval]))", "{{region}}"))


def detect_output_age():
    return stat_panel(
        "Detect job: last output", "Age of the detect job's newest incidents point (it writes once it has "
        "seen an anomaly; empty before).", "s", thresholds((None, "green"), (120, "red")),
        query(f"time() - max(timestamp({P.prom(P.OPEN_INCIDENTS)}))", "detect", instant=True))
