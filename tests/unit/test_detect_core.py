"""The streaming detector (flink_jobs/detect/core.py): warm-up, flat series, direction, one alert per anomaly,
bad values, clock jumps, and a state round trip that continues with identical output."""

from __future__ import annotations

import json
import math
import random

import pytest

from infersight.flink_jobs.detect.core import Detector, DetectorParams, EngineParams

P_UP = DetectorParams.for_signal("ttft_p99")
P_ERR = DetectorParams.for_signal("error_ratio")
P_PREFIX = DetectorParams.for_signal("prefix_cache_hit_ratio")


def feed(d: Detector, values, p: DetectorParams, t0: float = 0.0, step: float = 10.0):
    return [d.update(t0 + step * (i + 1), v, p) for i, v in enumerate(values)]


def noisy(n: int, level: float = 0.2, sd: float = 0.004, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    return [level + rng.gauss(0, sd) for _ in range(n)]


def test_warm_up_is_silent_even_on_wild_values():
    d = Detector()
    out = feed(d, [0.2, 5.0, 0.1, 9.0] * 7, P_UP)  # 28 windows < warm-up of 30
    assert all(ev is None and z == 0.0 for z, ev in out)


def test_a_shorter_warm_up_alerts_on_a_jump_the_default_still_learns_through():
    """The detect job's --warmup-windows: every signal's detectors and the silence rule take it."""
    short = EngineParams.with_warmup(12)
    assert short.established_windows == 12 and {p.warmup for p in short.detector.values()} == {12}
    assert short.detector["ttft_p99"] == DetectorParams.for_signal("ttft_p99", warmup=12)
    values = noisy(14) + [0.6] * 3  # TTFT triples after 14 windows
    assert [ev for _, ev in feed(Detector(), values, short.detector["ttft_p99"]) if ev] == ["onset"]
    assert [ev for _, ev in feed(Detector(), values, P_UP) if ev] == []  # 17 windows: the default's warm-up
    with pytest.raises(ValueError, match="at least 1"):
        EngineParams.with_warmup(0)


def test_flat_series_do_not_explode():
    d, e = Detector(), Detector()
    out = feed(d, [0.0] * 200 + [0.001, 0.002, 0.0, 0.001], P_ERR)  # error ratio 0, then a wobble
    assert all(ev is None for _, ev in out)
    assert max(z for z, _ in out) < 1.0
    out = feed(e, [1.0] * 200 + [0.995], P_PREFIX)  # a prefix-hit ratio stuck at 1
    assert all(ev is None for _, ev in out) and all(math.isfinite(z) for z, _ in out)


def test_direction_a_drop_of_an_up_signal_is_not_an_anomaly():
    d = Detector()
    out = feed(d, noisy(200) + [0.05] * 20, P_UP)  # TTFT falls: good news
    assert [ev for _, ev in out if ev] == []
    d = Detector()
    out = feed(d, noisy(200) + [0.6] * 20, P_UP)  # TTFT triples
    assert [ev for _, ev in out if ev] == ["onset"]
    d = Detector()
    out = feed(d, noisy(200, level=0.6) + [0.1] * 20, P_PREFIX)  # prefix hits collapse
    assert [ev for _, ev in out if ev] == ["onset"]


def test_one_alert_per_anomaly_and_an_end_when_it_is_over():
    d = Detector()
    out = feed(d, noisy(200) + [0.5] * 60 + noisy(40, seed=2), P_UP)
    events = [ev for _, ev in out if ev]
    assert events == ["onset", "end"]


def test_score_does_not_saturate():
    a, b = Detector(), Detector()
    za = feed(a, noisy(200) + [0.5], P_UP)[-1][0]
    zb = feed(b, noisy(200) + [5.0], P_UP)[-1][0]
    assert zb > za > 7


def test_nan_and_inf_are_counted_and_skipped():
    d = Detector()
    out = feed(d, noisy(100) + [float("nan"), float("inf"), float("-inf")] + noisy(10, seed=3), P_UP)
    assert d.n_nan == 1 and d.n_inf == 2
    assert all(ev is None for _, ev in out)


def test_clock_jumps_restart_the_warm_up_and_old_windows_are_counted():
    d = Detector()
    feed(d, noisy(100), P_UP)
    assert d.update(5.0, 0.2, P_UP) == (0.0, None)  # a window from the past
    assert d.n_out_of_order == 1
    assert d.update(1e9, 9.0, P_UP) == (0.0, None)  # the clock jumps years ahead: no alert, warm-up again
    assert d.n_clock_jumps == 1 and d.n == 1


def test_a_slow_creep_is_caught():
    d = Detector()
    creep = [v * (1 + 1.0 * i / 180) for i, v in enumerate(noisy(180, seed=4))]
    out = feed(d, noisy(300) + creep, P_UP)
    onsets = [i - 300 for i, (_, ev) in enumerate(out) if ev == "onset"]
    assert len(onsets) == 1 and onsets[0] < 60  # within +33 %


def test_state_round_trip_continues_identically():
    values = noisy(150) + [0.5] * 10 + noisy(100, seed=5)
    whole = Detector()
    expected = feed(whole, values, P_UP)
    first = Detector()
    got = feed(first, values[:155], P_UP)
    state = json.loads(json.dumps(first.to_state()))  # what keyed state would hold
    second = Detector.from_state(state)
    got += [second.update(10.0 * (i + 1), v, P_UP) for i, v in enumerate(values) if i >= 155]
    assert got == expected


def test_likelihood_scores_a_new_anomaly_high_once_and_round_trips():
    from infersight.flink_jobs.detect.core import Likelihood, LikelihoodParams

    lp = LikelihoodParams()
    rng = random.Random(9)
    zs = [rng.gauss(0, 1) for _ in range(400)] + [12.0] * 5 + [rng.gauss(0, 1) for _ in range(50)]
    lik = Likelihood()
    scores = [lik.update(z, lp) for z in zs]
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert max(scores[:400]) < lp.gate
    high = [i for i, s in enumerate(scores) if s >= lp.gate]
    assert high == [400]  # the first anomalous point, then the rest period
    a = Likelihood()
    first = [a.update(z, lp) for z in zs[:200]]
    b = Likelihood.from_state(json.loads(json.dumps(a.to_state())))
    assert first + [b.update(z, lp) for z in zs[200:]] == scores
