"""Per-region service health: traffic, errors, latency against the SLO line, availability."""

from __future__ import annotations

from infersight.dashboards import slo as S
from infersight.dashboards.common import (
    ERRORS,
    REQUESTS,
    quantile_gauge,
    query,
    sel,
    stat_panel,
    thresholds,
    timeseries_panel,
)
from infersight.schemas import pipeline as P

P99 = f'{P.LABEL_QUANTILE}="0.99"'
SERIES = "{{region}} {{model}} {{model_version}} {{track}}"


def request_rate():
    return timeseries_panel(
        "Request rate by region", "Requests ended per second (the metrics job's counter).", "reqps",
        thresholds((None, "green")),
        query(f"sum by (region) (rate({REQUESTS}{sel()}[$__rate_interval]))", "{{region}}"), line=False)


def error_ratio(config: S.SLOConfig):
    budget = 1 - config.default.availability_objective
    return timeseries_panel(
        "Error ratio by region", f"Failed / all requests; the red line is the default availability SLO's "
        f"allowance ({budget:.2%}).", "percentunit",
        thresholds((None, "green"), (budget, "red")),
        query(f"sum by (region) (rate({ERRORS}{sel()}[$__rate_interval]))\n"
              f"  / sum by (region) (rate({REQUESTS}{sel()}[$__rate_interval]))", "{{region}}"))


def ttft_p99(config: S.SLOConfig):
    line = config.default.ttft_threshold_s
    return timeseries_panel(
        "TTFT p99 per series vs SLO", "p99 time to first token of each 10 s window (the metrics job's "
        f"DDSketch, 0.5 % accurate); the red line is the default SLO threshold ({line * 1000:g} ms).", "s",
        thresholds((None, "green"), (line, "red")),
        query(f"max by (region, model, model_version, track) ({quantile_gauge('ttft_s')}"
              f"{sel(P99)})", SERIES))


def itl_p99():
    return timeseries_panel(
        "Inter-token latency p99 per series", "p99 over each window of the requests' own p99 inter-token "
        "gap (DDSketch); the line marks 100 ms, a stall users notice while text streams.", "s",
        thresholds((None, "green"), (0.1, "red")),
        query(f"max by (region, model, model_version, track) ({quantile_gauge('itl_p99_s')}"
              f"{sel(P99)})", SERIES))


def availability(config: S.SLOConfig):
    objective = config.default.availability_objective
    return stat_panel(
        "Availability over the range", f"Non-error requests / all over the dashboard's range; red under "
        f"the default objective ({objective:.2%}).", "percentunit",
        thresholds((None, "red"), (objective, "green")),
        query(f"1 - sum by (region) (increase({ERRORS}{sel()}[$__range]))\n"
              f"  / sum by (region) (increase({REQUESTS}{sel()}[$__range]))", "{{region}}", instant=True))
