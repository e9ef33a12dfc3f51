"""The quality-signals record: what the metrics job publishes on ``infersight.quality_signals`` per request series
and window, and what the quality job reads for its every-request drift signals instead of every request record
(issue #17: the quality job reads only these and the judged results).

One Kafka record (a JSON object, unkeyed) per request series (``keys.series_key``: region, model, model version,
track, engine; ``model_version`` empty when the requests named none) and metrics window (10 s by default), stamped
with the window's last millisecond::

    {"window_end_ms": 1800000010000, "window_ms": 10000, "region": "us-east-1", "model": "llama-3-8b",
     "model_version": "v7", "track": "stable", "engine": "vllm", "requests": 812,
     "signals": {"tokens_in": {"n": 812, "counts": [0, 0, 3, ...]}, "tokens_out": {...}, "ttft": {...},
                 "finish_reason": {...}, "error_type": {...}}}

``signals`` holds every signal of ``REQUEST_SIGNALS`` (the unsampled drift signals of ``schemas.quality``):
``counts`` the window's requests in each of the signal's bins (``DRIFT_SIGNALS``' bins, raw counts: every request
weighs 1), ``n`` how many requests it counted (all of them, but for ``ttft``: those with a TTFT). The bins, per
record (``flink_jobs/common/request_signals.py`` bins them, one numpy pass per batch):

- ``tokens_in``, ``tokens_out``: the record's value (0 when absent) in the log2 bins;
- ``ttft``: ``ttft_s`` where the record has one (errors included), in the TTFT bins;
- ``finish_reason``: its category in ``FINISH_REASONS``, anything else or none ``other``;
- ``error_type``: the error folded into ``ERROR_TYPES`` (``none`` without an error; ``timeout``, ``cancelled``,
  ``server``, ``client`` by its name or code; ``other``).

A window's record counts each of its requests once per copy received (as the quality job's own reading of the
request records did: no de-duplication by trace and span id). Partials of one quality window merge by adding
counts, so the quality job takes any number of these per series and window (one per engine of a quality series,
one per metrics window of its longer window). ``window_ms`` says which requests are in it (those whose end is in
``[window_end_ms - window_ms, window_end_ms)``): the quality job's window must hold whole metrics windows.
"""

from __future__ import annotations

from typing import Any

from infersight.schemas.quality import DRIFT_SIGNAL_BY_NAME

# the unsampled drift signals, in the order the quality job has always filled a window aggregate's histograms
REQUEST_SIGNALS: tuple[str, ...] = ("tokens_in", "tokens_out", "ttft", "finish_reason", "error_type")
LABEL_FIELDS: tuple[str, ...] = ("region", "model", "model_version", "track", "engine")
RECORD_FIELDS: tuple[str, ...] = ("window_end_ms", "window_ms", *LABEL_FIELDS, "requests", "signals")

assert all(name in DRIFT_SIGNAL_BY_NAME and not DRIFT_SIGNAL_BY_NAME[name].sampled for name in REQUEST_SIGNALS)


def record(window_end_ms: int, window_ms: int, labels: dict[str, str], requests: int,
           signals: dict[str, tuple[int, list[int]]]) -> dict[str, Any]:
    """A quality-signals record: ``labels`` the series' (``LABEL_FIELDS``), ``signals`` name -> (n, counts)."""
    return {"window_end_ms": window_end_ms, "window_ms": window_ms, **{f: labels[f] for f in LABEL_FIELDS},
            "requests": requests, "signals": {name: {"n": n, "counts": counts} for name, (n, counts) in
                                              signals.items()}}


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def problems(value: Any) -> list[str]:
    """Why a decoded record cannot be used, each naming its field (the dead letter's reason); empty when valid."""
    if not isinstance(value, dict):
        return [f"record: not a JSON object, got {type(value).__name__}"]
    out = [f"{name}: missing" for name in RECORD_FIELDS if name not in value]
    if out:
        return out
    end, window = value["window_end_ms"], value["window_ms"]
    if not (_count(end) and end < 2**62):
        out.append(f"window_end_ms: must be a non-negative integer (ms), got {end!r:.60}")
    if not (_count(window) and window > 0):
        out.append(f"window_ms: must be a positive integer (ms), got {window!r:.60}")
    elif _count(end) and end % window:
        out.append(f"window_end_ms: {end} is not a multiple of window_ms {window}")
    for f in LABEL_FIELDS:
        v = value[f]
        if not isinstance(v, str) or (not v and f != "model_version"):
            out.append(f"{f}: must be {'a' if f == 'model_version' else 'a non-empty'} string, got {v!r:.60}")
    requests = value["requests"]
    if not _count(requests) or requests == 0:
        out.append(f"requests: must be a positive integer, got {requests!r:.60}")
        requests = None
    signals = value["signals"]
    if not isinstance(signals, dict):
        return [*out, f"signals: must be an object, got {type(signals).__name__}"]
    for name in REQUEST_SIGNALS:
        s = signals.get(name)
        bins = DRIFT_SIGNAL_BY_NAME[name].bins
        if not isinstance(s, dict):
            out.append(f"signals.{name}: missing or not an object")
            continue
        n, counts = s.get("n"), s.get("counts")
        if not isinstance(counts, list) or len(counts) != bins or not all(_count(c) for c in counts):
            out.append(f"signals.{name}.counts: must be {bins} non-negative integers, got {counts!r:.60}")
        elif not _count(n) or sum(counts) != n:
            out.append(f"signals.{name}.n: must be the sum of its counts ({sum(counts)}), got {n!r:.60}")
        elif requests is not None and n > requests:
            out.append(f"signals.{name}.n: {n} is more than the window's requests ({requests})")
        elif requests is not None and name != "ttft" and n != requests:
            out.append(f"signals.{name}.n: must count every request ({requests}), got {n}")
    return out  # a signal this job does not know (a newer metrics job's) is no problem: it is left out
