"""The quality-signals records (``schemas.quality_signals``) the metrics job publishes for the quality job: per
regional request series and window, the every-request drift signals' bin counts. ``PreAggregate`` bins each group
of a batch (``common.request_signals.signal_rows``, one numpy pass per batch), the window adds its groups' rows
(``window_stats.window_of_groups``), and here a window result becomes its JSON record. Pure Python, so the job and
the tests build them the same way."""

from __future__ import annotations

import json

from infersight.flink_jobs.common.keys import labels_of
from infersight.flink_jobs.common.request_signals import signals_of
from infersight.flink_jobs.metrics.window_stats import WindowStats
from infersight.schemas import quality_signals as Q
from infersight.schemas.units import MS


def signals_record(key: str, end_ns: int, stats: WindowStats, window_ms: int) -> str | None:
    """The JSON record of a regional request window (``key``: ``keys.series_key``); None for a window without
    signals (a roll-up's, or one restored from a job before them)."""
    row = getattr(stats, "quality_signals", None)  # absent from a WindowStats pickled before the signals
    if row is None:
        return None
    signals = signals_of(row)
    return json.dumps(Q.record(end_ns // MS, window_ms, labels_of(key), signals["tokens_in"][0], signals),
                      separators=(",", ":"))
