"""Drift: histogram distances as effect sizes, the alarm's minimum samples and hysteresis, the three baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infersight.flink_jobs.quality.core import Engine, EngineParams, Series, WindowAggregate
from infersight.flink_jobs.quality.drift import (
    DAY_S,
    Alarm,
    DriftParams,
    Histogram,
    SignalDrift,
    distances,
)
from infersight.flink_jobs.quality.estimates import EvaluatorWindow
from infersight.schemas.quality import DRIFT_SIGNAL_BY_NAME, RELEVANCE, score_signal

SCORE = DRIFT_SIGNAL_BY_NAME[score_signal(RELEVANCE)]
FINISH = DRIFT_SIGNAL_BY_NAME["finish_reason"]
TOKENS = DRIFT_SIGNAL_BY_NAME["tokens_out"]


def _scores(rng: np.random.Generator, n: int, mean: float, sd: float = 0.1) -> Histogram:
    return Histogram.of_values(SCORE, np.clip(rng.normal(mean, sd, n), 0, 1))


def test_identical_histograms_are_at_distance_zero():
    h = Histogram(np.array([10.0, 20.0, 0.0, 5.0, 1.0, 0.0]), 36)
    d = distances(h, h, FINISH)
    assert d["js"] == pytest.approx(0.0, abs=1e-9)
    assert d["kl"] == pytest.approx(0.0, abs=1e-9) and d["psi"] == pytest.approx(0.0, abs=1e-9)
    assert d["wasserstein"] is None  # categorical: no order


def test_kl_is_finite_with_an_empty_baseline_bin_and_psi_is_the_symmetric_kl():
    cur = Histogram(np.array([5.0, 5.0, 0, 0, 0, 0]), 10)
    base = Histogram(np.array([10.0, 0, 0, 0, 0, 0]), 10)
    d, back = distances(cur, base, FINISH), distances(base, cur, FINISH)
    assert math.isfinite(d["kl"]) and d["kl"] > 0.1
    assert d["psi"] == pytest.approx(d["kl"] + back["kl"])
    assert d["js"] == pytest.approx(back["js"]) and 0 < d["js"] <= 1


def test_wasserstein_of_a_score_shift_is_the_shift():
    rng = np.random.default_rng(3)
    a, b = _scores(rng, 200_000, 0.6), _scores(rng, 200_000, 0.5)
    assert distances(a, b, SCORE)["wasserstein"] == pytest.approx(0.1, abs=0.01)


def test_flag_rate_change_is_the_wasserstein_distance():
    pii = DRIFT_SIGNAL_BY_NAME["guardrail.pii"]
    cur = Histogram.of_values(pii, np.array([1.0] * 10 + [0.0] * 90))
    base = Histogram.of_values(pii, np.array([1.0] * 2 + [0.0] * 98))
    assert distances(cur, base, pii)["wasserstein"] == pytest.approx(0.08)


def test_of_values_puts_outliers_in_the_outer_bins_and_weights_counts():
    h = Histogram.of_values(TOKENS, np.array([0.0, 3.0, 1e9]), weights=np.array([1.0, 10.0, 100.0]))
    assert h.n == 3 and h.counts.sum() == pytest.approx(111.0)
    assert h.counts[-1] == pytest.approx(100.0) and h.counts[0] == pytest.approx(1.0)


def test_alarm_needs_confirmation_reports_since_and_clears_with_hysteresis():
    p = DriftParams(confirm=2, clear_ratio=0.8, clear_evals=2)
    a = Alarm()
    assert a.step(10, 0.05, 0.03, True, p) is None and a.since == 10
    assert a.step(20, 0.05, 0.03, True, p) == "onset" and a.since == 10
    assert a.step(30, 0.026, 0.03, True, p) is None  # under the threshold, not under the clear level
    assert a.step(40, 0.01, 0.03, True, p) is None
    assert a.step(50, 0.01, 0.03, True, p) == "end" and not a.open


def test_alarm_never_opens_on_too_few_samples():
    a = Alarm()
    for t in range(10):
        assert a.step(t, 1.0, 0.03, False, DriftParams()) is None


def test_current_set_grows_until_it_holds_the_minimum_samples():
    sd = SignalDrift(SCORE, DriftParams(current_s=30, max_current_s=600))
    rng = np.random.default_rng(0)
    for end in range(10, 610, 10):
        sd.add_window(end, _scores(rng, 50, 0.7))
    cur = sd.current()
    assert cur.n >= SCORE.min_current  # 600 samples: 12 windows, though current_s is 30 s
    assert cur.n == 600


def _feed(engine: Engine, days: float, mean_of, rate_per_window: int = 40, seed: int = 0,
          series: tuple[Series, ...] = (Series("r1", "m", "v1", "stable"),), start: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for end in range(start + 10, start + int(days * DAY_S) + 1, 10):
        aggs = {}
        for s in series:
            ys = np.clip(rng.normal(mean_of(s, end), 0.15, rate_per_window), 0, 1)
            ev = EvaluatorWindow.empty()
            ev.score.add_many(ys, np.full(ys.size, 0.01))
            aggs[s] = WindowAggregate({RELEVANCE: ev}, {SCORE.name: Histogram.of_values(SCORE, ys, np.full(ys.size,
                                                                                                           100.0))})
        out += [dict(r, at=end) for r in engine.close_window(end, aggs)]
    return out


def test_previous_day_baseline_catches_a_drop_and_stays_quiet_before_it():
    engine = Engine(EngineParams(signals=(SCORE,)))
    drop_at = DAY_S + 3 * 3600
    out = _feed(engine, 1.0 + 4 * 3600 / DAY_S, lambda s, t: 0.70 if t > drop_at else 0.78)
    onsets = [r for r in out if r["type"] == "drift" and r["event"] == "onset"]
    assert len(onsets) == 1
    ev = onsets[0]
    assert drop_at < ev["at"] <= drop_at + 300
    assert ev["signal"] == SCORE.name and ev["distance"] == "wasserstein" and ev["over_by"] > 1
    assert ev["since"] <= ev["at"] and ev["baseline"] == "previous_day"
    # until data of about a day ago exists there is no baseline: records carry no drift distances then
    first = [r for r in out if r["type"] == "quality" and r["window_end"] < DAY_S - 2400]
    assert first and all(not r["drift"] for r in first)


def test_stable_track_is_the_canarys_baseline():
    stable, canary = Series("r1", "m", "v1", "stable"), Series("r1", "m", "v2", "canary")
    engine = Engine(EngineParams(baseline="stable_track", signals=(SCORE,)))
    out = _feed(engine, 3600 / DAY_S, lambda s, t: 0.70 if s.track == "canary" else 0.80, rate_per_window=100,
                series=(stable, canary))
    onsets = [r for r in out if r["type"] == "drift" and r["event"] == "onset"]
    assert [(r["track"], r["version"]) for r in onsets] == [("canary", "v2")]


def test_reference_baseline_is_the_series_first_period_frozen_and_catches_a_later_drop():
    params = EngineParams(baseline="reference", signals=(SCORE,), drift=DriftParams(reference_s=600))
    engine = Engine(params)
    start, drop_at = 5000, 5000 + 1800
    out = _feed(engine, 3600 / DAY_S, lambda s, t: 0.70 if t > drop_at else 0.78, rate_per_window=100, start=start)
    # no baseline while the reference fills (its first window at start + 10): no distances, no alarm
    assert all(not r["drift"] for r in out if r["type"] == "quality" and r["window_end"] <= start + 10 + 600)
    measured = [r for r in out if r["type"] == "quality" and r["drift"]]
    assert measured and measured[0]["window_end"] > start + 10 + 600
    onsets = [r for r in out if r["type"] == "drift" and r["event"] == "onset"]
    assert len(onsets) == 1 and drop_at < onsets[0]["at"] <= drop_at + 300
    assert onsets[0]["baseline"] == "reference"
    sd = engine.drift[Series("r1", "m", "v1", "stable")][SCORE.name]
    assert sd.reference is not None and sd.reference.n == 61 * 100  # the first 600 s and one window: frozen since
    restored = SignalDrift(SCORE)
    restored.__setstate__(sd.__getstate__())
    assert restored.reference_from == sd.reference_from and restored.reference.n == sd.reference.n
    assert np.array_equal(restored.reference.counts, sd.reference.counts)


def test_pinned_baseline_and_quality_records():
    rng = np.random.default_rng(5)
    pinned = {("r1", "m", SCORE.name): _scores(rng, 20_000, 0.78, sd=0.15)}  # what _feed sends
    engine = Engine(EngineParams(baseline="pinned", signals=(SCORE,)), pinned=pinned)
    out = _feed(engine, 1800 / DAY_S, lambda s, t: 0.78)
    recs = [r for r in out if r["type"] == "quality"]
    assert not [r for r in out if r["type"] == "drift"]
    last = recs[-1]
    assert last["drift"][SCORE.name]["distances"]["wasserstein"] < 0.03
    rel = last["evaluators"][RELEVANCE]
    assert rel["ci_low"] < rel["mean"] < rel["ci_high"] and abs(rel["mean"] - 0.78) < 0.1
    assert last["composite"] == pytest.approx(last["evaluators"][RELEVANCE]["mean"])


def test_unknown_baseline_kind_is_refused():
    with pytest.raises(ValueError, match="baseline must be one of"):
        EngineParams(baseline="yesterday")


def test_series_past_the_bound_are_counted_not_tracked():
    engine = Engine(EngineParams(signals=(SCORE,), max_series=2))
    aggs = {Series(f"r{i}", "m", "v", "stable"): WindowAggregate() for i in range(5)}
    engine.close_window(10, aggs)
    assert len(engine.drift) == 2 and engine.dropped_series == 3


def test_an_alarm_ending_without_a_measurement_still_names_its_signal():
    """The end of an alarm whose baseline went away (no distance in that window) is an event of its signal."""
    rng = np.random.default_rng(6)
    pinned = {("r1", "m", SCORE.name): _scores(rng, 20_000, 0.78, sd=0.15)}
    engine = Engine(EngineParams(baseline="pinned", signals=(SCORE,)), pinned=pinned)
    out = _feed(engine, 1800 / DAY_S, lambda s, t: 0.60)
    assert [r["event"] for r in out if r["type"] == "drift"] == ["onset"]
    engine.pinned = {}
    out = _feed(engine, 600 / DAY_S, lambda s, t: 0.60, start=1800)
    (end,) = [r for r in out if r["type"] == "drift"]
    assert end["event"] == "end" and end["signal"] == SCORE.name and end["value"] is None
