"""The quality engine, pure Python: per window and series, the weighted estimates and the drift of every signal
against the chosen baseline, with drift events. No Flink here (the job keys it by region and model, so one
engine instance sees every version and track of a model in a region: the stable track is at hand as a
baseline for a canary).

A series is (region, model, version, track). ``close_window`` takes one window's aggregates of all series of
the engine's key, in window order (no look-ahead: a window's distances use only windows up to it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from infersight.flink_jobs.quality.drift import DAY_S, DriftParams, Histogram, SignalDrift, drift_event
from infersight.flink_jobs.quality.estimates import EvaluatorWindow, summarise
from infersight.schemas.quality import BASELINE_KINDS, DRIFT_SIGNALS, DriftSignal

STABLE = "stable"


class Series(NamedTuple):
    region: str
    model: str
    version: str
    track: str

    def labels(self) -> dict[str, str]:
        return self._asdict()


@dataclass
class WindowAggregate:
    """One series' window: evaluator sums and the histogram of each drift signal seen."""

    evaluators: dict[str, EvaluatorWindow] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)

    def merge(self, other: WindowAggregate) -> WindowAggregate:
        ev = dict(self.evaluators)
        for k, v in other.evaluators.items():
            ev[k] = ev[k].merge(v) if k in ev else v
        hs = {k: Histogram(v.counts.copy(), v.n) for k, v in self.histograms.items()}
        for k, v in other.histograms.items():
            if k in hs:
                hs[k].add(v)
            else:
                hs[k] = Histogram(v.counts.copy(), v.n)
        return WindowAggregate(ev, hs)


@dataclass(frozen=True)
class EngineParams:
    baseline: str = "previous_day"  # one of schemas.quality.BASELINE_KINDS
    drift: DriftParams = field(default_factory=DriftParams)
    signals: tuple[DriftSignal, ...] = DRIFT_SIGNALS
    thresholds: Mapping[str, float] = field(default_factory=dict)  # signal -> threshold override
    composite_weights: Mapping[str, float] | None = None
    confidence: float = 0.95
    max_series: int = 200  # per engine (per region and model); a series past it is counted, not tracked
    idle_expiry_s: int = DAY_S + 7200

    def __post_init__(self) -> None:
        if self.baseline not in BASELINE_KINDS:
            raise ValueError(f"baseline must be one of {BASELINE_KINDS}, got {self.baseline!r}")


class Engine:
    """Windows in, quality records and drift events out. ``pinned`` (for the ``pinned`` baseline) maps
    (region, model, signal) to the reference histogram, e.g. built from a period of the Parquet archive."""

    def __init__(self, params: EngineParams | None = None,
                 pinned: Mapping[tuple[str, str, str], Histogram] | None = None) -> None:
        self.params = params or EngineParams()
        self.pinned = dict(pinned or {})
        self.drift: dict[Series, dict[str, SignalDrift]] = {}
        self.last_seen: dict[Series, int] = {}
        self.dropped_series = 0

    def _state(self, s: Series) -> dict[str, SignalDrift] | None:
        if s not in self.drift:
            if len(self.drift) >= self.params.max_series:
                self.dropped_series += 1
                return None
            self.drift[s] = {sig.name: SignalDrift(sig, self.params.drift) for sig in self.params.signals}
        return self.drift[s]

    def _baseline(self, s: Series, sd: SignalDrift, window_end: int) -> Histogram | None:
        kind = self.params.baseline
        if kind == "previous_day":
            return sd.previous_day(window_end)
        if kind == "pinned":
            return self.pinned.get((s.region, s.model, sd.signal.name))
        if kind == "reference":
            return sd.reference_baseline(window_end)
        if s.track == STABLE:  # stable_track: the stable track has no baseline of its own
            return None
        for other, states in self.drift.items():
            if other.region == s.region and other.model == s.model and other.track == STABLE:
                return states[sd.signal.name].last(self.params.drift.stable_window_s)
        return None

    def close_window(self, window_end: int, aggregates: Mapping[Series, WindowAggregate]) -> list[dict[str, Any]]:
        """Feed one window (``window_end`` in Unix seconds) of every series that had data; series seen before
        and silent now get an empty window (their current set moves on). Returns the quality record of each
        series with data and the drift events."""
        for s in aggregates:
            self.last_seen[s] = window_end
        for s in [s for s, t in self.last_seen.items() if t < window_end - self.params.idle_expiry_s]:
            self.last_seen.pop(s)
            self.drift.pop(s, None)
        live: list[Series] = []
        for s in sorted(self.last_seen):
            states = self._state(s)
            if states is None:
                continue
            live.append(s)
            agg = aggregates.get(s)
            for name, sd in states.items():
                h = agg.histograms.get(name) if agg else None
                sd.add_window(window_end, h if h is not None else Histogram.empty(sd.signal.bins))
        out: list[dict[str, Any]] = []
        for s in live:
            measured: dict[str, Any] = {}
            for name, sd in self.drift[s].items():
                m, event = sd.evaluate(window_end, self._baseline(s, sd, window_end),
                                       self.params.thresholds.get(name))
                if m is not None:
                    measured[name] = m
                if event:  # an alarm may end on a window without a measurement: the event still names its signal
                    out.append(drift_event(event, s.labels(), m if m is not None else {"signal": name}, sd.alarm,
                                           window_end, self.params.baseline))
            agg = aggregates.get(s)
            if agg is None:
                continue
            rec = {"type": "quality", "window_end": window_end, **s.labels(),
                   **summarise(agg.evaluators, self.params.composite_weights, self.params.confidence),
                   "drift": {k: {"distances": v["distances"], "alarm_distance": v["alarm_distance"],
                                 "threshold": v["threshold"], "current_samples": v["current_samples"],
                                 "baseline_samples": v["baseline_samples"]} for k, v in measured.items()},
                   "baseline": self.params.baseline}
            out.append(rec)
        return out
