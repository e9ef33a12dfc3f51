"""The canary statistics (flink_jobs/canary/stats.py, reservoir.py) against brute force and scipy: the
Hodges–Lehmann shift and Moser interval equal the pairwise-difference order statistics, the proportion test's
interval covers, alpha spending sums to alpha, and the weighted reservoir samples the weighted population."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from infersight.flink_jobs.canary.reservoir import Reservoir
from infersight.flink_jobs.canary.stats import (
    alpha_spent,
    compare_proportions,
    hodges_lehmann,
    hodges_lehmann_interval,
    rank_p_value,
)


@pytest.mark.parametrize("n1,n2", [(31, 40), (200, 150), (400, 400)])
def test_hodges_lehmann_is_the_median_of_pairwise_differences(n1, n2):
    rng = np.random.default_rng(n1)
    x, y = rng.lognormal(0.2, 0.5, n1), rng.lognormal(0.0, 0.5, n2)
    diffs = np.sort(np.subtract.outer(x, y).ravel())
    assert hodges_lehmann(x, y) == pytest.approx(diffs[diffs.size // 2], abs=1e-6)
    # Moser's interval: the order statistics at the Mann-Whitney critical rank
    z = stats.norm.ppf(0.975)
    k = math.floor(n1 * n2 / 2 - z * math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12))
    low, high = hodges_lehmann_interval(x, y, 0.95)
    assert low == pytest.approx(diffs[k], abs=1e-6) and high == pytest.approx(diffs[-k - 1], abs=1e-6)


def test_shift_interval_covers_a_known_shift_about_as_often_as_promised():
    rng = np.random.default_rng(5)
    covered = 0
    for _ in range(200):
        x, y = rng.normal(0.3, 1, 60), rng.normal(0, 1, 80)
        low, high = hodges_lehmann_interval(x, y, 0.9)
        covered += low <= 0.3 <= high
    assert 0.84 <= covered / 200 <= 0.96


def test_rank_p_value_is_scipys_and_sees_a_shift():
    rng = np.random.default_rng(2)
    x, y = rng.normal(0, 1, 500), rng.normal(0, 1, 500)
    assert rank_p_value(x, y) == pytest.approx(stats.mannwhitneyu(x, y).pvalue, rel=1e-9)
    assert rank_p_value(x + 0.5, y) < 1e-10


def test_proportion_comparison():
    same = compare_proportions(100, 10_000, 1000, 100_000, 0.95)
    assert same.shift == pytest.approx(0.0) and same.p_value > 0.9 and same.ci_low < 0 < same.ci_high
    worse = compare_proportions(200, 10_000, 1000, 100_000, 0.95)
    assert worse.shift == pytest.approx(0.01) and worse.p_value < 1e-6 and worse.ci_low > 0
    none = compare_proportions(0, 1000, 0, 1000, 0.95)  # no errors anywhere: no evidence, no crash
    assert none.p_value == 1.0 and none.shift == 0.0


def test_alpha_spending_is_monotone_and_sums_to_alpha():
    looks = np.linspace(0.05, 1.0, 20)
    spent = [alpha_spent(t, 0.01) for t in looks]
    assert all(a <= b for a, b in zip(spent, spent[1:], strict=False))
    assert spent[-1] == pytest.approx(0.01) and alpha_spent(0.0, 0.01) == 0.0
    assert spent[0] < 1e-10  # O'Brien-Fleming: almost nothing at the first look


def test_reservoir_is_bounded_uniform_and_mergeable():
    r = Reservoir(1000, seed=1)
    for k in range(20):
        r.add(np.arange(k * 5000, (k + 1) * 5000, dtype=float))
    assert len(r) == 1000 and r.seen == 100_000
    assert np.median(r.values) == pytest.approx(50_000, rel=0.08)  # uniform over everything offered
    r.add(np.array([np.nan, np.inf]))
    assert r.seen == 100_000  # non-finite values are skipped
    other = Reservoir(1000, seed=2)
    other.add(np.full(100_000, 1e9))
    r.merge(other)
    assert len(r) == 1000 and r.seen == 200_000 and 0.4 < np.mean(r.values == 1e9) < 0.6
    again = Reservoir.from_state(r.to_state())
    assert np.array_equal(again.values, r.values) and again.seen == r.seen


def test_weighted_reservoir_samples_the_population_the_weights_stand_for():
    # scores judged at 10 % on one half and 100 % on the other: weights 10 and 1 restore the 50/50 mix
    # (once the reservoir overflows: below capacity every value is kept, see the module's docstring)
    r = Reservoir(500, seed=3)
    r.add(np.zeros(5000), np.full(5000, 10.0))    # 10 % judged of 50,000 requests scoring 0
    r.add(np.ones(50_000), np.ones(50_000))       # all judged of 50,000 requests scoring 1
    assert 0.42 < np.mean(r.values) < 0.58
    unweighted = Reservoir(500, seed=3)
    unweighted.add(np.zeros(5000))
    unweighted.add(np.ones(50_000))
    assert np.mean(unweighted.values) > 0.85


def test_reservoir_rejects_a_zero_capacity():
    with pytest.raises(ValueError, match="capacity"):
        Reservoir(0)
