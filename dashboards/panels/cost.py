"""Cost and efficiency from the metrics job's cost counters (GPU-seconds and USD from the pricing file)."""

from __future__ import annotations

from infersight.dashboards.common import TOKENS, pod_gauge, query, sel, stat_panel, thresholds, timeseries_panel
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P

USD = P.prom(P.COST_USD)
IDLE = P.prom(P.IDLE_COST_USD)
GPU_S = P.prom(P.GPU_SECONDS)
OUTPUT = f'{P.LABEL_TOKEN_TYPE}="output"'
R = "[$__rate_interval]"
MEAN = f'{P.LABEL_STAT}="mean"'


def usd_per_1m_output_tokens():
    return timeseries_panel(
        "USD per 1M output tokens by region and model", "GPU cost / output tokens x 1e6, both as rates over "
        "the interval (summing counters, not averaging the per-window gauge).", "currencyUSD",
        thresholds((None, "green"), (5, "orange"), (20, "red")),
        query(f"1e6 * sum by (region, model) (rate({USD}{sel()}{R}))\n"
              f"  / sum by (region, model) (rate({TOKENS}{sel(OUTPUT)}{R}))", "{{region}} {{model}}"))


def gpu_hours_per_day():
    return timeseries_panel(
        "GPU-hours per day by region", "GPU time paid for over the trailing day (GPUs of every pod seen x "
        "time).", "h", thresholds((None, "green")),
        query(f"sum by (region) (increase({GPU_S}{sel()}[1d])) / 3600", "{{region}}"), line=False)


def usd_per_day():
    return timeseries_panel(
        "GPU cost per day by region", "USD over the trailing day, from the pricing file's USD per GPU-hour.",
        "currencyUSD", thresholds((None, "green")),
        query(f"sum by (region) (increase({USD}{sel()}[1d]))", "{{region}}"), line=False)


def idle_cost():
    return timeseries_panel(
        "Idle GPU cost by region (USD/day)", "Each pod's cost x (1 - its GPU utilisation), as a daily rate: "
        "paid for, not used.", "currencyUSD", thresholds((None, "green")),
        query(f"86400 * sum by (region) (rate({IDLE}{sel()}{R}))", "{{region}}"), line=False)


def idle_share():
    return stat_panel(
        "Idle share of GPU cost", "Idle cost / cost over the dashboard's range; orange above 50 %.",
        "percentunit", thresholds((None, "green"), (0.5, "orange"), (0.8, "red")),
        query(f"sum by (region) (increase({IDLE}{sel()}[$__range]))\n"
              f"  / sum by (region) (increase({USD}{sel()}[$__range]))", "{{region}}", instant=True))


def output_tokens_per_gpu_second():
    return timeseries_panel(
        "Output tokens per GPU-second by region and model", "Generated tokens / GPU-seconds paid for: "
        "throughput per unit of spend (higher is better).", "short", thresholds((None, "red"), (10, "green")),
        query(f"sum by (region, model) (rate({TOKENS}{sel(OUTPUT)}{R}))\n"
              f"  / sum by (region, model) (rate({GPU_S}{sel()}{R}))", "{{region}} {{model}}"), line=False)


def utilization():
    return timeseries_panel(
        "GPU utilisation by region and model", "Mean NVML utilisation of each deployment's pods.",
        "percentunit", thresholds((None, "red"), (0.3, "orange"), (0.6, "green")),
        query(f'avg by (region, model) ({pod_gauge(M.HW_GPU_UTILIZATION)}{sel(MEAN)})',
              "{{region}} {{model}}"), line=False)
