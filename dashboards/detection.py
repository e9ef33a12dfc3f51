"""Detection: the detect job's incidents and anomalies (docs/detection.md)."""

from __future__ import annotations

from infersight.dashboards.common import compose, dashboard, variables
from infersight.dashboards.panels import detection

UID = "infersight-detection"


def build():
    dash = dashboard(UID, "infersight / Detection", "Incidents open by scope and kind, anomaly onsets and "
                     "the series in an anomaly episode now.", ["detection"])
    for v in variables(names=("region", "model")):
        dash = dash.with_variable(v)
    return compose(dash, [
        ("Incidents", [detection.open_incidents_total(), detection.open_incidents_by_scope()]),
        ("Anomalies", [detection.anomaly_onsets(), detection.active_anomalies()]),
    ])
