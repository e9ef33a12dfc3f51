"""The detect job's view: open incidents by scope and kind, anomaly onsets and the active anomalies."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from infersight.dashboards.common import DATASOURCE, query, stat_panel, thresholds, timeseries_panel
from infersight.schemas import pipeline as P

OPEN = P.prom(P.OPEN_INCIDENTS)
ONSETS = P.prom(P.ANOMALIES)
SCORE = P.prom(P.ANOMALY_SCORE)
SEL = '{region=~"$region", model=~"$model"}'


def open_incidents_total():
    return stat_panel(
        "Open incidents", "Incidents the detect job has open now (any scope); details on infersight.anomalies.",
        "short", thresholds((None, "green"), (1, "red")),
        query(f"sum(last_over_time({OPEN}[5m]))", "open", instant=True))


def open_incidents_by_scope():
    return timeseries_panel(
        "Open incidents by scope and kind", "infersight_detect_incidents_open: each scope (series, "
        "model_region, region, multi_region, global) and kind (outage, latency, ...).", "short",
        thresholds((None, "green"), (1, "red")),
        query(f"sum by (scope_kind, kind) ({OPEN})", "{{scope_kind}} {{kind}}"))


def anomaly_onsets():
    return timeseries_panel(
        "Anomaly onsets by region and signal", "New anomalies per interval (signal=\"silent\": a series that "
        "stopped sending).", "short", thresholds((None, "green"), (1, "orange")),
        query(f"sum by (region, signal) (increase({ONSETS}{SEL}[$__rate_interval]))", "{{region}} {{signal}}"))


def active_anomalies():
    panel = (table.Panel().title("Active anomalies").description(
        "Series in an anomaly episode now, with its peak score (z: spreads away from expected); 12+ is a "
        "major, 30+ a critical incident.").datasource(DATASOURCE).unit("short")
        .thresholds(thresholds((None, "green"), (12, "orange"), (30, "red"))).height(8).span(12))
    return panel.with_target(query(f"max by (region, model, track, signal) (last_over_time({SCORE}{SEL}[1m]))",
                                   instant=True).format(PromQueryFormat.TABLE))


def incident_annotation():
    """Marks on every time series while the detect job has an incident open (Grafana joins consecutive
    points into a region per scope and kind)."""
    return (db.AnnotationQuery().name("Open incidents").datasource(DATASOURCE).enable(True).icon_color("red")
            .expr(f"sum by (scope_kind, kind) ({OPEN}) > 0"))
