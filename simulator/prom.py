"""The Prometheus queries the live view, the fault-tolerance tests and the benchmark share."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import requests

from infersight.schemas import pipeline as P

WINDOW_REQUESTS = P.prom(P.WINDOW_REQUESTS)  # as the sink collector names it in Prometheus


def query(url: str, promql: str, at_s: float | None = None, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": promql}
    if at_s is not None:
        params["time"] = at_s
    resp = requests.get(f"{url}/api/v1/query", params=params, timeout=timeout_s)
    resp.raise_for_status()
    body = resp.json()
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {promql!r}: {body}")
    return body["data"]["result"]


def window_counts(url: str, lookback_s: int, models: tuple[str, ...] = ()) -> dict[int, int]:
    """Requests per window (window end in ms -> count) over regional series (the global roll-up left out),
    from every sample of the per-window gauge in the last ``lookback_s`` seconds."""
    selector = f'{P.LABEL_REGION}!="{P.GLOBAL_REGION}"'
    if models:
        selector += f',{P.LABEL_MODEL}=~"{"|".join(models)}"'
    out: dict[int, int] = defaultdict(int)
    for series in query(url, f"{WINDOW_REQUESTS}{{{selector}}}[{int(lookback_s)}s]"):
        for ts, value in series["values"]:
            out[round(float(ts) * 1000)] += int(float(value))
    return dict(out)


def window_arrivals(url: str, lookback_s: int) -> dict[int, int]:
    """Global windows present now: window end in ms -> request count (for freshness polling)."""
    out: dict[int, int] = {}
    for series in query(url, f'{WINDOW_REQUESTS}{{{P.LABEL_REGION}="{P.GLOBAL_REGION}"}}[{int(lookback_s)}s]'):
        for ts, value in series["values"]:
            key = round(float(ts) * 1000)
            out[key] = out.get(key, 0) + int(float(value))
    return out
