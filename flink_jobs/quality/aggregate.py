"""Records into the engine's window aggregates: evaluation records (``schemas.evaluation``, from
``infersight.evaluations``) and request records (``infersight.requests`` batches: the reference path; the job reads
the metrics job's quality signals, binned by ``common.request_signals`` as ``series_aggregates`` bins records) ->
one ``WindowAggregate`` per (window end, series). Pure; what the quality job's window operator runs before
``Engine.close_window``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, MutableMapping
from typing import Any

import numpy as np

from infersight.flink_jobs.common.request_signals import category, error_kind, signal_rows, signals_of
from infersight.flink_jobs.quality.core import Series, WindowAggregate
from infersight.flink_jobs.quality.drift import Histogram
from infersight.flink_jobs.quality.estimates import EvaluatorWindow
from infersight.schemas.quality import DRIFT_SIGNAL_BY_NAME, ERROR_TYPES, FINISH_REASONS, score_signal
from infersight.schemas.units import NS

Aggregates = MutableMapping[tuple[int, Series], WindowAggregate]


def window_end_s(time_ns: int, window_s: int) -> int:
    """End (Unix seconds) of the tumbling window holding ``time_ns``."""
    return (time_ns // NS // window_s + 1) * window_s


def _series(rec: dict[str, Any]) -> Series:
    return Series(rec.get("region") or "", rec.get("model") or "", rec.get("model_version") or "",
                  rec.get("track") or "stable")


def add_evaluations(aggs: Aggregates, records: Iterable[dict[str, Any]], window_s: int = 10) -> int:
    """Add valid evaluation records; returns how many had no score (a judge error or an unparsed reply:
    counted, not estimated)."""
    unscored = 0
    for rec in records:
        score, rate, name = rec.get("score"), rec["sample_rate"], rec["name"]
        if score is None:
            unscored += 1
            continue
        key = (window_end_s(rec["time_ns"], window_s), _series(rec))
        agg = aggs.setdefault(key, WindowAggregate())
        agg.evaluators.setdefault(name, EvaluatorWindow.empty()).add(name, float(score), float(rate))
        signal = DRIFT_SIGNAL_BY_NAME.get(score_signal(name)) or DRIFT_SIGNAL_BY_NAME.get(name)
        if signal is not None:
            h = Histogram.of_values(signal, np.array([score]), np.array([1.0 / rate]))
            if signal.name in agg.histograms:
                agg.histograms[signal.name].add(h)
            else:
                agg.histograms[signal.name] = h
    return unscored


_category = category  # (the names this module has always used)
_error_kind = error_kind


def add_requests(aggs: Aggregates, records: Iterable[dict[str, Any]], window_s: int = 10) -> None:
    """Add request records' every-request signals (lengths, TTFT, finish reasons, error types), vectorised per
    (window, series)."""
    groups: dict[tuple[int, Series], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        groups[(window_end_s(rec["end_ns"], window_s), _series(rec))].append(rec)
    for key, recs in groups.items():
        add_series_requests(aggs.setdefault(key, WindowAggregate()), recs)


def add_series_requests(agg: WindowAggregate, recs: list[dict[str, Any]]) -> None:
    """Add one series' request records of one window to its aggregate (``add_requests`` per group; the quality
    job's reader, which groups the records itself, calls it directly)."""
    ttft = np.array([r["ttft_s"] for r in recs if r.get("ttft_s") is not None], dtype=float)
    hists = {
        "tokens_in": Histogram.of_values(DRIFT_SIGNAL_BY_NAME["tokens_in"],
                                         np.array([r.get("tokens_in") or 0 for r in recs], dtype=float)),
        "tokens_out": Histogram.of_values(DRIFT_SIGNAL_BY_NAME["tokens_out"],
                                          np.array([r.get("tokens_out") or 0 for r in recs], dtype=float)),
        "ttft": Histogram.of_values(DRIFT_SIGNAL_BY_NAME["ttft"], ttft),
        "finish_reason": Histogram.of_values(DRIFT_SIGNAL_BY_NAME["finish_reason"], _category(
            [r.get("finish_reason") for r in recs], FINISH_REASONS, "other")),
        "error_type": Histogram.of_values(DRIFT_SIGNAL_BY_NAME["error_type"], _category(
            [_error_kind(r.get("error_type")) for r in recs], ERROR_TYPES, "none")),
    }
    for name, h in hists.items():
        if name in agg.histograms:
            agg.histograms[name].add(h)
        else:
            agg.histograms[name] = h


def series_aggregates(groups: list[list[dict[str, Any]]]) -> list[WindowAggregate]:
    """``add_series_requests`` into a fresh aggregate per group, for all of a batch's groups at once: each signal
    binned in one numpy pass over the batch and counted per group (``request_signals.signal_rows``, what the metrics
    job publishes per series and window) — the same counts and sample numbers, without a numpy call per group and
    signal (a batch has a group per window and series)."""
    return [aggregate_of_row(row) for row in signal_rows(groups)]


def aggregate_of_row(row: Any) -> WindowAggregate:
    """A window aggregate holding the every-request signals of one ``request_signals`` row."""
    agg = WindowAggregate()
    for name, (n, counts) in signals_of(row).items():
        agg.histograms[name] = Histogram(np.asarray(counts, dtype=float), n)
    return agg
