"""The window-stats record: what the metrics job publishes on ``infersight.window_stats`` per series and window,
and what the detect job reads (it never parses OTLP).

One Kafka record (JSON) per series and 10 s window::

    {"window_end": 1796500540.0, "region": "us-east-1", "model": "llama-3-8b", "track": "stable@v7",
     "signals": {"request_rate": 98.2, "error_ratio": 0.0, "ttft_p99": 0.41, ...}}

``signals`` holds the signals (``schemas.detection.SIGNALS``) the window has: a window without successful
requests has no latency quantiles, a deployment without pods no pod gauges. Request-derived and pod-derived
signals of one series come as two records (they close in different windows of the job). ``track`` is the
deployment track with the model version (``series_track``): a new version is a new series, so the detector
can name it as a likely cause. ``rows`` turns a record into the replay CSV's rows (``docs/detection.md``).
"""

from __future__ import annotations

import math
from typing import Any

from infersight.schemas.detection import SIGNAL_BY_NAME

RECORD_FIELDS = ("window_end", "region", "model", "track", "signals")


def series_track(version: str, track: str) -> str:
    """A series' track column: ``<track>@<version>`` (``default`` for an unnamed track)."""
    base = track or "default"
    return f"{base}@{version}" if version else base


def record(window_end_s: float, region: str, model: str, track: str, signals: dict[str, float]) -> dict[str, Any]:
    """A window-stats record; non-finite values are dropped (a window without them has no such signal)."""
    return {"window_end": window_end_s, "region": region, "model": model, "track": track,
            "signals": {k: v for k, v in signals.items() if isinstance(v, (int, float)) and math.isfinite(v)}}


def record_problem(value: Any) -> str | None:
    """Why a decoded record cannot be used (a short reason for the dead-letter topic), or None."""
    if not isinstance(value, dict):
        return "not_an_object"
    for name in RECORD_FIELDS:
        if name not in value:
            return f"missing_{name}"
    if not all(isinstance(value[k], str) and value[k] for k in ("region", "model", "track")):
        return "bad_series"
    t = value["window_end"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        return "bad_window_end"
    if not isinstance(value["signals"], dict):
        return "bad_signals"
    return None


def rows(value: dict[str, Any]) -> list[dict[str, Any]]:
    """The replay rows of a valid record, one per known signal (unknown signal names are left out: a newer
    metrics job may publish more than this detector knows)."""
    return [{"window_end": value["window_end"], "region": value["region"], "model": value["model"],
             "track": value["track"], "signal": name, "value": v}
            for name, v in sorted(value["signals"].items()) if name in SIGNAL_BY_NAME]
