"""Serving saturation per region from the pods' gauges (the metrics job's roll-ups, ``stat`` label)."""

from __future__ import annotations

from infersight.dashboards.common import TOKENS, pod_gauge, query, sel, thresholds, timeseries_panel
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P


def _stat(s: str) -> str:
    return f'{P.LABEL_STAT}="{s}"'


def queue_depth():
    return timeseries_panel(
        "Queue depth by region", "Requests waiting for the scheduler, summed over pods (each pod's last value "
        "in the window); the line marks 8 per region.", "short", thresholds((None, "green"), (8, "red")),
        query(f"sum by (region) ({pod_gauge(M.QUEUE_DEPTH)}{sel(_stat('sum'))})", "{{region}}"))


def kv_cache():
    g = pod_gauge(M.KV_CACHE_USAGE)
    return timeseries_panel(
        "KV-cache use by region", "Mean over the deployments' pods and the hottest pod; near 100 % the engine "
        "preempts requests.", "percentunit", thresholds((None, "green"), (0.9, "red")),
        query(f"avg by (region) ({g}{sel(_stat('mean'))})", "mean {{region}}"),
        query(f"max by (region) ({g}{sel(_stat('max'))})", "hottest pod {{region}}", ref="B"))


def prefix_cache_hit():
    rate = "rate({m}{s}[$__rate_interval])"
    cached = rate.format(m=TOKENS, s=sel(f'{P.LABEL_TOKEN_TYPE}="cached"'))
    prompt = rate.format(m=TOKENS, s=sel(f'{P.LABEL_TOKEN_TYPE}="input"'))
    return timeseries_panel(
        "Prefix-cache hit ratio by region", "Prompt tokens served from the prefix cache / prompt tokens; "
        "a collapse (cache thrash) shows under the line.", "percentunit",
        thresholds((None, "red"), (0.2, "green")),
        query(f"sum by (region) ({cached}) / sum by (region) ({prompt})", "{{region}}"))


def gpu_utilization():
    return timeseries_panel(
        "GPU utilisation by region", "Mean NVML utilisation of the deployments' pods; low means paid-for "
        "idle GPUs, the line marks 95 %.", "percentunit", thresholds((None, "green"), (0.95, "red")),
        query(f"avg by (region) ({pod_gauge(M.HW_GPU_UTILIZATION)}{sel(_stat('mean'))})", "{{region}}"))


def gpu_memory():
    used, limit = pod_gauge(M.HW_GPU_MEMORY_USAGE), pod_gauge(M.HW_GPU_MEMORY_LIMIT)
    return timeseries_panel(
        "GPU memory used by region", "GPU memory in use / total over the pods (NVML).", "percentunit",
        thresholds((None, "green"), (0.95, "red")),
        query(f"sum by (region) ({used}{sel(_stat('sum'))}) / sum by (region) ({limit}{sel(_stat('sum'))})",
              "{{region}}"))
