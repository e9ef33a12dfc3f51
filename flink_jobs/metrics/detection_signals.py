"""The window-stats records (``schemas.window_stats``) the metrics job publishes for the detect job: per
request series and per deployment, each window's signals (``schemas.detection.SIGNALS``) as plain numbers.

Pure Python, so the job and the tests compute them the same way. Quantiles come from the window's merged
sketches (never an average of percentiles)."""

from __future__ import annotations

import json
from typing import Any

from infersight.flink_jobs.common.keys import deployment_labels, labels_of
from infersight.flink_jobs.metrics.window_stats import WindowStats
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P
from infersight.schemas import window_stats as W
from infersight.schemas.units import NS

# signal -> (pod gauge, its roll-up stat over the deployment's pods)
POD_SIGNALS = {
    "queue_depth": (M.QUEUE_DEPTH, "sum"),
    "kv_cache_usage": (M.KV_CACHE_USAGE, "mean"),
    "batch_size": (M.BATCH_SIZE, "mean"),
    "gpu_utilization": (M.HW_GPU_UTILIZATION, "mean"),
}


def request_signals(stats: WindowStats, window_s: float) -> dict[str, float]:
    """A request series' signals in one window (latency quantiles only where the window has values)."""
    out: dict[str, float] = {"request_rate": stats.requests / window_s}
    if stats.requests:
        out["error_ratio"] = stats.error_count / stats.requests
    out["tokens_per_s"] = stats.tokens["output"] / window_s
    if stats.tokens["input"]:
        out["prefix_cache_hit_ratio"] = stats.tokens["cached"] / stats.tokens["input"]
    for signal, dist, q in (("ttft_p50", "ttft_s", 0.5), ("ttft_p99", "ttft_s", 0.99),
                            ("itl_p99", "itl_p99_s", 0.99), ("e2e_p99", "e2e_s", 0.99)):
        value = stats.dists[dist].quantile(q)
        if value is not None:
            out[signal] = value
    return out


def request_record(key: str, end_ns: int, stats: WindowStats, window_s: float) -> str:
    """The JSON window-stats record of a request series' window (``key``: ``keys.series_key``)."""
    labels = labels_of(key)
    track = W.series_track(labels[P.LABEL_MODEL_VERSION], labels[P.LABEL_TRACK])
    return json.dumps(W.record(end_ns / NS, labels[P.LABEL_REGION], labels[P.LABEL_MODEL], track,
                               request_signals(stats, window_s)), separators=(",", ":"))


def pod_record(key: str, end_ns: int, pod_stats: dict[str, dict[str, float]]) -> str | None:
    """The JSON window-stats record of a deployment's pod gauges (``key``: ``keys.deployment_key``), None for a
    roll-up key (the detect job correlates deployments itself) or a window without those gauges."""
    labels: dict[str, Any] = deployment_labels(key)
    if labels[P.LABEL_REGION] == P.GLOBAL_REGION or labels[P.LABEL_MODEL] == P.ALL_DEPLOYMENTS:
        return None
    signals = {signal: pod_stats[metric][stat] for signal, (metric, stat) in POD_SIGNALS.items()
               if stat in pod_stats.get(metric, {})}
    if not signals:
        return None
    track = W.series_track(labels[P.LABEL_MODEL_VERSION], labels[P.LABEL_TRACK])
    return json.dumps(W.record(end_ns / NS, labels[P.LABEL_REGION], labels[P.LABEL_MODEL], track, signals),
                      separators=(",", ":"))
