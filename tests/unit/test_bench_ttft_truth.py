"""The TTFT benchmark's loop-lag percentile from two cumulative histogram points."""

from __future__ import annotations

import math

from bench.ttft_truth import _lag_p99_ms, _pct


def test_lag_p99_is_the_bound_of_the_bucket_holding_it_over_the_runs_growth():
    bounds = [0.001, 0.01, 0.1]
    before = (bounds, [500, 0, 0, 0])  # earlier samples, all under 1 ms, must not count
    after = (bounds, [599, 0, 1, 0])  # this run: 99 under 1 ms, one between 10 and 100 ms
    assert _lag_p99_ms(before, after) == 1.0
    after = (bounds, [590, 0, 10, 0])
    assert _lag_p99_ms(before, after) == 100.0
    assert math.isinf(_lag_p99_ms(None, (bounds, [0, 0, 0, 5])))
    assert _lag_p99_ms(before, None) is None and _lag_p99_ms(before, before) is None


def test_percentiles_in_ms():
    assert _pct([0.001, 0.002, 0.003], 50) == 2.0 and _pct([], 99) is None
