"""The detection contract: the window-stats signals the detectors read, and the anomaly / incident records
they write on ``infersight.anomalies``.

One window-stats row is one value of one signal of one series in one 10 s window:
``window_end`` (Unix seconds), ``region``, ``model``, ``track`` (deployment track or version, e.g. ``stable``,
``canary``, ``v2``), ``signal`` (a name from ``SIGNALS``), ``value``. A series is (region, model, track).

Each signal carries the direction in which a change is bad news: ``up`` (only a rise is an anomaly: errors,
latencies, queues), ``down`` (only a fall: prefix-cache hits), ``both`` (either way: request rate, where a
fall can be an outage and a rise a surge). ``floor_abs`` / ``floor_rel`` set the smallest spread the
detector assumes (absolute, and relative to the level), so a flat series (an error ratio of 0, a prefix-hit
ratio near 1) does not turn its first wobble into an infinite score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Signal:
    name: str
    unit: str
    direction: str  # "up" | "down" | "both"
    floor_abs: float
    floor_rel: float
    role: str  # "traffic" | "errors" | "latency" | "saturation" | "cache"
    description: str


SIGNALS: tuple[Signal, ...] = (
    Signal("request_rate", "{request}/s", "both", 0.05, 0.02, "traffic",
           "Requests finished in the window per second. A fall can be an outage, a rise a surge."),
    Signal("error_ratio", "1", "up", 0.005, 0.0, "errors", "Errored requests / requests in the window."),
    Signal("ttft_p50", "s", "up", 0.002, 0.02, "latency", "Median time to first token."),
    Signal("ttft_p99", "s", "up", 0.005, 0.03, "latency", "99th percentile time to first token."),
    Signal("itl_p99", "s", "up", 0.001, 0.03, "latency", "99th percentile inter-token latency."),
    Signal("e2e_p99", "s", "up", 0.01, 0.03, "latency", "99th percentile end-to-end request duration."),
    Signal("queue_depth", "{request}", "up", 0.5, 0.05, "saturation", "Mean waiting requests per pod."),
    Signal("kv_cache_usage", "1", "up", 0.01, 0.0, "saturation", "Mean KV-cache use (0..1)."),
    Signal("prefix_cache_hit_ratio", "1", "down", 0.01, 0.0, "cache", "Prefix-cache hits / queries (0..1)."),
    Signal("batch_size", "{request}", "both", 0.5, 0.03, "saturation", "Mean running batch size per pod."),
    Signal("gpu_utilization", "1", "both", 0.01, 0.0, "saturation", "Mean GPU utilisation (0..1)."),
    Signal("tokens_per_s", "{token}/s", "both", 1.0, 0.02, "traffic", "Generated tokens per second."),
)
SIGNAL_BY_NAME: dict[str, Signal] = {s.name: s for s in SIGNALS}
SIGNAL_NAMES: tuple[str, ...] = tuple(s.name for s in SIGNALS)
# the pseudo-signal of a series that stopped sending
SILENT = "silent"

WINDOW_STATS_COLUMNS: tuple[str, ...] = ("window_end", "region", "model", "track", "signal", "value")

SCOPE_KINDS: tuple[str, ...] = ("series", "model_region", "region", "multi_region", "global")
INCIDENT_EVENTS: tuple[str, ...] = ("open", "update", "resolve")

# an anomaly point (a detector's onset) on infersight.anomalies
ANOMALY_FIELDS: tuple[str, ...] = (
    "type",  # "anomaly"
    "window_end", "region", "model", "track", "signal", "direction",  # direction: "up" | "down"
    "value", "expected", "score", "summary",
)
# an incident event on infersight.anomalies; the replay CLI writes the final state of each incident
INCIDENT_FIELDS: tuple[str, ...] = (
    "type",  # "incident"
    "event",  # "open" | "update" | "resolve"
    "id", "kind", "scope_kind", "regions", "absorbing_regions", "models", "signals", "start", "end",
    "severity", "chance_p", "likely_cause", "anomalies", "summary",
)
INCIDENT_KINDS: tuple[str, ...] = (
    "outage", "silent", "errors", "latency", "cache_thrash", "traffic_surge", "bad_rollout", "degradation",
)
# a notice on infersight.anomalies: a region's silence that its region status explains (never paged, never an
# incident): its link is delayed (the data will come late) or it has no traffic. "start" when the first of its
# series falls quiet, "end" when the last has resumed or, the status no longer explaining it, is called silent.
NOTICE_FIELDS: tuple[str, ...] = (
    "type",  # "notice"
    "event",  # "start" | "end"
    "kind", "region", "window_end", "start", "end", "status", "cause", "link_lag_s", "backlog_records",
    "backlog_estimated", "series", "models", "resumed", "summary",
)
NOTICE_KINDS: tuple[str, ...] = ("delayed", "no_traffic")
NOTICE_EVENTS: tuple[str, ...] = ("start", "end")


def row_problem(row: dict[str, Any]) -> str | None:
    """Why a window-stats row cannot be used (a short reason to count), or None when it is good.
    Missing fields, an unknown signal, a non-numeric or non-finite value or time."""
    for name in WINDOW_STATS_COLUMNS:
        if row.get(name) in (None, ""):
            return f"missing_{name}"
    try:
        t = float(row["window_end"])
    except (TypeError, ValueError):
        return "bad_window_end"
    if not math.isfinite(t) or t < 0:
        return "bad_window_end"
    if row["signal"] not in SIGNAL_BY_NAME:
        return "unknown_signal"
    try:
        v = float(row["value"])
    except (TypeError, ValueError):
        return "non_numeric_value"
    if math.isnan(v):
        return "nan_value"
    if math.isinf(v):
        return "inf_value"
    return None
