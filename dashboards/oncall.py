"""On-call SRE: is a region healthy, are we inside the SLOs, what is burning the budget, what is open."""

from __future__ import annotations

from infersight.dashboards import slo as S
from infersight.dashboards.common import compose, dashboard, variables
from infersight.dashboards.panels import detection, health, pipeline, saturation
from infersight.dashboards.panels import slo as slo_panels

UID = "infersight-oncall"


def build(config: S.SLOConfig):
    dash = dashboard(UID, "infersight / On-call", "Per-region health against the SLOs, error budgets, "
                     "saturation, open incidents and the pipeline's freshness.", ["oncall", "slo"])
    for v in variables():
        dash = dash.with_variable(v)
    dash = dash.annotation(detection.incident_annotation())
    return compose(dash, [
        ("Health by region", [health.request_rate(), health.error_ratio(config),
                              health.ttft_p99(config), health.client_ttft_p99(config),
                              health.itl_p99()]),
        ("SLOs and error budgets", [health.availability(config),
                                    slo_panels.budget_remaining(config, "ttft", "TTFT"),
                                    slo_panels.budget_remaining(config, "errors", "Availability"),
                                    detection.open_incidents_total(),
                                    slo_panels.burn_rate("ttft", "TTFT"),
                                    slo_panels.burn_rate("errors", "Availability")]),
        ("Saturation", [saturation.queue_depth(), saturation.kv_cache(), saturation.prefix_cache_hit(),
                        saturation.gpu_utilization(), saturation.gpu_memory(), pipeline.freshness()]),
        ("Incidents", [detection.open_incidents_by_scope(), detection.active_anomalies()]),
    ])
