"""The NAB-only scorer (flink_jobs/detect/nab_detector.py, used by bench/nab.py): streaming, no look-ahead,
value novelty, rest period, bounded cost."""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace

from bench.nab import NAB_DETECTOR, scores_for
from infersight.flink_jobs.detect.nab_detector import NabDetector

STEP = 300.0  # NAB's usual 5-minute spacing


def series(n: int, seed: int = 1, level: float = 100.0, noise: float = 5.0) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(1.4e9 + i * STEP, level + rng.uniform(-noise, noise)) for i in range(n)]  # bounded: a range to learn


def test_no_look_ahead_a_prefix_scores_the_same():
    vals = series(2000)
    vals[1500] = (vals[1500][0], 400.0)
    full = scores_for(vals)
    for cut in (10, 301, 1200, 1501):
        assert scores_for(vals[:cut]) == full[:cut]


def test_scores_are_in_unit_interval_and_quiet_on_bounded_noise():
    s = scores_for(series(3000, seed=7))
    assert all(0.0 <= v <= 1.0 for v in s)
    assert all(v < NAB_DETECTOR.gate for v in s[400:])  # plain noise: nothing reaches the gate after warm-up


def test_a_new_value_range_scores_one_then_rests():
    vals = series(1500)
    for i in range(1000, 1010):  # a level never seen before
        vals[i] = (vals[i][0], 200.0)
    s = scores_for(vals)
    assert s[1000] == 1.0
    assert all(v == 0.0 for v in s[1001:1001 + NAB_DETECTOR.rest - 1])
    assert max(s[:1000]) < NAB_DETECTOR.gate


def test_novelty_waits_for_probation():
    vals = series(400)
    vals[100] = (vals[100][0], 1000.0)  # before probation: no novelty score (the Detector is still warming up)
    s = scores_for(vals)
    assert s[100] == 0.0
    d = NabDetector()
    p = replace(NAB_DETECTOR, probation=10_000)
    for t, x in series(1000):
        d.update(t, x, p)
    assert d.n <= p.probation and d.hi < 106.0  # the range is tracked during probation, only not scored


def test_nan_and_inf_score_zero_and_do_not_move_the_range():
    d = NabDetector()
    for t, x in series(500):
        d.update(t, x, NAB_DETECTOR)
    lo, hi = d.lo, d.hi
    assert d.update(1.5e9, math.nan, NAB_DETECTOR) == 0.0
    assert d.update(1.5e9 + STEP, math.inf, NAB_DETECTOR) == 0.0
    assert (d.lo, d.hi) == (lo, hi)


def test_cost_per_point_is_bounded():
    vals = series(20_000, seed=3)
    t = time.perf_counter()
    scores_for(vals)
    us = (time.perf_counter() - t) / len(vals) * 1e6
    assert us < 200.0  # the budget is 50 us; bench/nab.py records the measured figure (a shared machine here)
