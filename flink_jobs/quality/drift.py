"""Drift of one signal of one series against a baseline: mergeable histograms, distances, the alarm.

Histograms are fixed-bin (``schemas.quality.DRIFT_SIGNALS``) weighted counts plus the raw sample count, so
windows merge by addition. Distances (current vs baseline), all effect sizes, none a test statistic:

- ``kl``: Kullback-Leibler divergence KL(current || baseline) in nats, both sides smoothed by half a sample
  per bin (an empty baseline bin would make it infinite); the sum of ``scipy.special.rel_entr`` (the ufunc
  under ``scipy.stats.entropy``, without its ~0.3 ms of argument handling per call).
- ``js``: Jensen-Shannon distance, base 2, in 0..1; ``scipy.spatial.distance.jensenshannon``.
- ``wasserstein``: the 1-Wasserstein distance over the bin positions (normalised to 0..1, see
  ``schemas.quality``); ``scipy.stats.wasserstein_distance``. For a pure shift of a 0..1 score it is the
  shift of the mean; on a 0/1 flag it is the change of the flag rate. None for categorical signals.
- ``psi``: the population-stability index, sum((p - q) ln(p / q)) over the smoothed bins, which is
  KL(p || q) + KL(q || p): computed as those two ``rel_entr`` sums.

The alarm never looks at a p-value: a signal alarms when its configured distance is over its threshold while
both sides hold at least the minimum number of raw samples, for ``confirm`` evaluations in a row; it ends after
``clear_evals`` evaluations under ``clear_ratio`` x threshold.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import special, stats
from scipy.spatial.distance import jensenshannon

from infersight.flink_jobs.common.request_signals import bin_index
from infersight.schemas.quality import DriftSignal

__all__ = ["Alarm", "DriftParams", "Histogram", "SignalDrift", "bin_index", "distances", "drift_event"]

DAY_S = 86_400


@dataclass
class Histogram:
    """Weighted bin counts of one signal and the raw number of samples behind them."""

    counts: np.ndarray
    n: int = 0

    @classmethod
    def empty(cls, bins: int) -> Histogram:
        return cls(np.zeros(bins), 0)

    @classmethod
    def of_values(cls, signal: DriftSignal, values: np.ndarray, weights: np.ndarray | None = None) -> Histogram:
        """Bin numeric ``values`` (categorical: category indices) with optional weights (1 / sample rate)."""
        values = np.asarray(values, dtype=float)
        counts = np.bincount(bin_index(signal, values), weights=weights, minlength=signal.bins).astype(float)
        return cls(counts, int(values.size))

    def add(self, other: Histogram) -> None:
        self.counts = self.counts + other.counts
        self.n += other.n


@functools.cache
def _positions(signal: DriftSignal) -> np.ndarray | None:
    pos = signal.positions()
    return None if pos is None else np.asarray(pos)


def distances(current: Histogram, baseline: Histogram, signal: DriftSignal) -> dict[str, float | None]:
    """Every distance of ``current`` from ``baseline`` (both non-empty)."""
    p = current.counts / current.counts.sum()
    q = baseline.counts / baseline.counts.sum()
    # half a raw sample per bin, as a probability on each side
    ps = p + 0.5 / max(current.n, 1)
    qs = q + 0.5 / max(baseline.n, 1)
    ps, qs = ps / ps.sum(), qs / qs.sum()
    kl_pq = float(special.rel_entr(ps, qs).sum())
    pos = _positions(signal)
    return {
        "kl": kl_pq,
        "js": float(jensenshannon(p, q, base=2)),
        "wasserstein": float(stats.wasserstein_distance(pos, pos, p, q)) if pos is not None else None,
        "psi": kl_pq + float(special.rel_entr(qs, ps).sum()),
    }


@dataclass(frozen=True)
class DriftParams:
    # the current window set: the newest windows covering at least current_s seconds and at least the signal's
    # min_current raw samples (so the noise under the threshold is the same at night as at the peak), at most
    # max_current_s seconds; under min_current samples it may not alarm
    current_s: int = 180
    max_current_s: int = 600
    confirm: int = 2  # evaluations over the threshold in a row that open an alarm
    clear_ratio: float = 0.8
    clear_evals: int = 6
    day_bucket_s: int = 300  # previous-day baseline: 5-minute buckets kept for a day and an hour
    day_half_width_s: int = 1800  # ... and the baseline is the previous day's +- 30 minutes
    stable_window_s: int = 1800  # stable-track baseline: the stable track's last 30 minutes
    reference_s: int = 3600  # reference baseline: the series' first hour of data, frozen after it


@dataclass
class Alarm:
    """The alarm state machine of one (series, signal)."""

    open: bool = False
    since: int | None = None  # first window end of the run over the threshold
    over_run: int = 0
    clear_run: int = 0

    def step(self, window_end: int, value: float | None, threshold: float, eligible: bool,
             params: DriftParams) -> str | None:
        """Feed one evaluation; returns ``"onset"``, ``"end"`` or None."""
        over = eligible and value is not None and value > threshold
        if not self.open:
            if over:
                self.over_run += 1
                if self.since is None:
                    self.since = window_end
                if self.over_run >= params.confirm:
                    self.open, self.clear_run = True, 0
                    return "onset"
            else:
                self.over_run, self.since = 0, None
            return None
        under = value is None or value < params.clear_ratio * threshold
        self.clear_run = self.clear_run + 1 if under else 0
        if self.clear_run >= params.clear_evals:
            self.open, self.since, self.over_run, self.clear_run = False, None, 0, 0
            return "end"
        return None


@dataclass
class SignalDrift:
    """One (series, signal): the recent windows (the current set), the previous-day buckets, the alarm."""

    signal: DriftSignal
    params: DriftParams = field(default_factory=DriftParams)
    recent: deque[tuple[int, Histogram]] = field(default_factory=deque)
    day_buckets: dict[int, Histogram] = field(default_factory=dict)
    alarm: Alarm = field(default_factory=Alarm)
    reference: Histogram | None = None  # the reference baseline's histogram, and the end of its first window
    reference_from: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        """A compact pickled form (the quality job keeps engines in keyed state and pickles them every window):
        the recent windows and the previous-day buckets as one 2-D array each rather than one ``Histogram``
        object per window, and empty recent windows as their end alone. Exact: counts stay float64."""
        bins = self.signal.bins
        full = [(end, h) for end, h in self.recent if h.n or h.counts.any()]
        return {"signal": self.signal, "params": self.params, "alarm": self.alarm,
                "recent_ends": np.array([end for end, _ in self.recent], dtype=np.int64),
                "recent_full": np.array([end for end, _ in full], dtype=np.int64),
                "recent_counts": np.array([h.counts for _, h in full], dtype=float).reshape(len(full), bins),
                "recent_n": np.array([h.n for _, h in full], dtype=np.int64),
                "day_keys": np.array(sorted(self.day_buckets), dtype=np.int64),
                "day_counts": np.array([self.day_buckets[k].counts for k in sorted(self.day_buckets)],
                                       dtype=float).reshape(len(self.day_buckets), bins),
                "day_n": np.array([self.day_buckets[k].n for k in sorted(self.day_buckets)], dtype=np.int64),
                "reference": None if self.reference is None else (self.reference.counts, self.reference.n),
                "reference_from": self.reference_from}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.signal, self.params, self.alarm = state["signal"], state["params"], state["alarm"]
        bins = self.signal.bins
        full = {int(end): Histogram(counts.copy(), int(n)) for end, counts, n in
                zip(state["recent_full"], state["recent_counts"], state["recent_n"], strict=True)}
        self.recent = deque((int(end), full.get(int(end)) or Histogram.empty(bins)) for end in state["recent_ends"])
        self.day_buckets = {int(k): Histogram(counts.copy(), int(n)) for k, counts, n in
                            zip(state["day_keys"], state["day_counts"], state["day_n"], strict=True)}
        ref = state.get("reference")  # absent in states pickled before the reference baseline existed
        self.reference = None if ref is None else Histogram(ref[0].copy(), int(ref[1]))
        self.reference_from = state.get("reference_from")

    def add_window(self, window_end: int, hist: Histogram) -> None:
        """One window's histogram (window ends in seconds, in order)."""
        self.recent.append((window_end, hist))
        keep = max(self.params.max_current_s, self.params.stable_window_s)
        while self.recent and self.recent[0][0] <= window_end - keep:
            self.recent.popleft()
        if hist.n:
            if self.reference_from is None:
                self.reference_from, self.reference = window_end, Histogram.empty(self.signal.bins)
            if window_end <= self.reference_from + self.params.reference_s and self.reference is not None:
                self.reference.add(hist)
            b = window_end - window_end % self.params.day_bucket_s
            if b not in self.day_buckets:
                self.day_buckets[b] = Histogram.empty(self.signal.bins)
                horizon = window_end - DAY_S - 2 * self.params.day_half_width_s
                for old in [k for k in self.day_buckets if k < horizon]:
                    del self.day_buckets[old]
            self.day_buckets[b].add(hist)

    def current(self) -> Histogram:
        """The current window set (see ``DriftParams``)."""
        out = Histogram.empty(self.signal.bins)
        if not self.recent:
            return out
        newest = self.recent[-1][0]
        for end, h in reversed(self.recent):
            if newest - end >= self.params.max_current_s or (newest - end >= self.params.current_s
                                                             and out.n >= self.signal.min_current):
                break
            out.add(h)
        return out

    def last(self, span_s: int) -> Histogram:
        """The windows of the last ``span_s`` seconds merged (what a stable track offers as a baseline)."""
        out = Histogram.empty(self.signal.bins)
        if self.recent:
            newest = self.recent[-1][0]
            for end, h in self.recent:
                if newest - end < span_s:
                    out.add(h)
        return out

    def reference_baseline(self, window_end: int) -> Histogram | None:
        """The series' first ``reference_s`` seconds of data (from its first window with data), once they are
        complete; None before (a reference still filling would hold the current windows too)."""
        if self.reference_from is None or window_end <= self.reference_from + self.params.reference_s:
            return None
        return self.reference

    def previous_day(self, window_end: int) -> Histogram:
        """The same hours of the previous day: the buckets within +- half width of ``window_end - 1 day``."""
        step, half = self.params.day_bucket_s, self.params.day_half_width_s
        centre = window_end - DAY_S
        first = centre - half - (centre - half) % step
        out = Histogram.empty(self.signal.bins)
        for b in range(first, centre + half + 1, step):
            h = self.day_buckets.get(b)
            if h is not None and abs(b + step / 2 - centre) <= half:
                out.add(h)
        return out

    def evaluate(self, window_end: int, baseline: Histogram | None,
                 threshold: float | None = None) -> tuple[dict[str, Any] | None, str | None]:
        """Distances of the current set from ``baseline`` and the alarm's event, if any."""
        thr = self.signal.threshold if threshold is None else threshold
        cur = self.current()
        ok = (baseline is not None and cur.n > 0 and baseline.n > 0 and cur.counts.sum() > 0
              and baseline.counts.sum() > 0)
        dist = distances(cur, baseline, self.signal) if ok and baseline is not None else None
        eligible = (dist is not None and baseline is not None and cur.n >= self.signal.min_current
                    and baseline.n >= self.signal.min_baseline)
        value = dist[self.signal.alarm_distance] if dist else None
        event = self.alarm.step(window_end, value, thr, eligible, self.params)
        if dist is None:
            return None, event
        return {"signal": self.signal.name, "distances": dist, "alarm_distance": self.signal.alarm_distance,
                "value": value, "threshold": thr, "current_samples": cur.n,
                "baseline_samples": baseline.n if baseline else 0, "eligible": eligible}, event


def drift_event(kind: str, series: dict[str, str], measured: dict[str, Any] | None, alarm: Alarm,
                window_end: int, baseline_kind: str) -> dict[str, Any]:
    """The record of an alarm's onset or end: which signal, which distance, how far over, since when."""
    m = measured or {}
    value, thr = m.get("value"), m.get("threshold")
    return {"type": "drift", "event": kind, **series, "signal": m.get("signal"), "baseline": baseline_kind,
            "distance": m.get("alarm_distance"), "value": value, "threshold": thr,
            "over_by": (value / thr) if value is not None and thr else None,
            "since": alarm.since if kind == "onset" else None, "window_end": window_end,
            "distances": m.get("distances")}
