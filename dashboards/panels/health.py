"""Per-region service health: traffic, errors, latency against the SLO line, availability."""

from __future__ import annotations

from infersight.dashboards import slo as S
from infersight.dashboards.common import (
    ERRORS,
    ITL_P99,
    REQUESTS,
    TTFT,
    quantile_gauge,
    query,
    sel,
    stat_panel,
    thresholds,
    timeseries_panel,
)
from infersight.schemas import pipeline as P

P99 = f'{P.LABEL_QUANTILE}="0.99"'
CLIENT_TTFT, CLIENT_GAP = P.prom(P.CLIENT_TTFT), P.prom(P.CLIENT_OUTSIDE_SERVER)


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


def _regional_p99(histogram: str) -> str:
    # the native histogram (schemas.pipeline.EXPONENTIAL_SCALE): mergeable, ~1 % from exact at any range
    return f"histogram_quantile(0.99, sum by (region) (rate({histogram}{sel()}[$__rate_interval])))"


def ttft_p99(config: S.SLOConfig):
    line = config.default.ttft_threshold_s
    return timeseries_panel(
        "TTFT p99 by region vs SLO", "p99 time to first token of the region's requests (native histogram, "
        f"~1 % from exact); the red line is the default SLO threshold ({line * 1000:g} ms). B: the worst "
        "deployment's 10 s window (DDSketch).", "s",
        thresholds((None, "green"), (line, "red")),
        query(_regional_p99(TTFT), "{{region}}"),
        query(f"max by (region) ({quantile_gauge('ttft_s')}{sel(P99)})", "worst window {{region}}", ref="B"))


def client_ttft_p99(config: S.SLOConfig):
    line = config.default.ttft_threshold_s
    # clients know neither version nor track: their series carry the server record's region and model only
    clients = sel(f'{P.LABEL_MODEL}=~"$model"', deployment=False)
    return timeseries_panel(
        "TTFT p99 as clients feel it vs the server's", "p99 of the instrumented clients' own TTFT (the call to the "
        "first token's chunk, joined to its request by trace), the server's edge TTFT of the same region, and "
        "the part outside any server timer (client TTFT - the request's TTFT: the client's send, the network, "
        f"the server's event loop before the app). The red line: the default SLO threshold ({line * 1000:g} ms).",
        "s", thresholds((None, "green"), (line, "red")),
        query(f"histogram_quantile(0.99, sum by (region) (rate({CLIENT_TTFT}{clients}[$__rate_interval])))",
              "client {{region}}"),
        query(_regional_p99(TTFT), "server {{region}}", ref="B"),
        query(f"histogram_quantile(0.99, sum by (region) (rate({CLIENT_GAP}{clients}[$__rate_interval])))",
              "outside the server {{region}}", ref="C"))


def itl_p99():
    return timeseries_panel(
        "Inter-token latency p99 by region", "p99 over the region's requests of each request's own p99 "
        "inter-token gap (native histogram); the line marks 100 ms, a stall users notice while text streams.",
        "s", thresholds((None, "green"), (0.1, "red")),
        query(_regional_p99(ITL_P99), "{{region}}"))


def availability(config: S.SLOConfig):
    objective = config.default.availability_objective
    return stat_panel(
        "Availability over the range", f"Non-error requests / all over the dashboard's range; red under "
        f"the default objective ({objective:.2%}).", "percentunit",
        thresholds((None, "red"), (objective, "green")),
        query(f"1 - sum by (region) (increase({ERRORS}{sel()}[$__range]))\n"
              f"  / sum by (region) (increase({REQUESTS}{sel()}[$__range]))", "{{region}}", instant=True))
