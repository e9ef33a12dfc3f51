"""The statistics of a canary verdict, pure numpy/scipy: the rank test, the Hodges–Lehmann shift with its
distribution-free confidence interval, the two-proportion comparison, and the alpha spent by each interim look.

Why some of it is by hand: scipy has the Mann–Whitney U test but no Hodges–Lehmann estimator, and no
two-sample proportion test with a confidence interval of the difference (statsmodels has one, but is not a
dependency of the pipeline for five lines of arithmetic)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

PRECISION = 1e-7  # an order statistic is found to this share of the pairwise differences' spread
BRACKET_PAIRS = 4096  # random pairs whose quantiles bracket the order statistic before the bisection


@dataclass(frozen=True)
class Comparison:
    """canary minus stable: the shift estimate, its confidence interval, and the two-sided p-value."""

    shift: float
    ci_low: float
    ci_high: float
    p_value: float


def rank_p_value(canary: np.ndarray, stable: np.ndarray) -> float:
    """Two-sided Mann–Whitney U p-value (normal approximation with tie correction: the samples are large)."""
    return float(stats.mannwhitneyu(canary, stable, alternative="two-sided", method="asymptotic").pvalue)


def _count_at_most(canary_sorted: np.ndarray, stable_sorted: np.ndarray, d: float) -> int:
    """#{(i, j): canary_i - stable_j <= d}, in O(n log n) with a sorted search (never the n1 x n2 pairs)."""
    below = np.searchsorted(stable_sorted, canary_sorted - d, side="left")  # stable_j < canary_i - d
    return int(canary_sorted.size * stable_sorted.size - below.sum())


def _order_statistic(canary_sorted: np.ndarray, stable_sorted: np.ndarray, rank: int) -> float:
    """The ``rank``-th smallest (1-based) pairwise difference canary_i - stable_j: bisection on the count of
    differences at most d, started from a bracket read off random pairs (checked, else the full range)."""
    lo = float(canary_sorted[0] - stable_sorted[-1])
    hi = float(canary_sorted[-1] - stable_sorted[0])
    if _count_at_most(canary_sorted, stable_sorted, lo) >= rank:
        return lo
    eps = PRECISION * (hi - lo)
    n1, n2 = canary_sorted.size, stable_sorted.size
    pairs = n1 * n2
    if pairs > 4 * BRACKET_PAIRS:
        rng = np.random.default_rng(rank)  # deterministic: the same data gives the same answer
        sample = np.sort(canary_sorted[rng.integers(0, n1, BRACKET_PAIRS)]
                         - stable_sorted[rng.integers(0, n2, BRACKET_PAIRS)])
        q = rank / pairs
        spread = 5 * math.sqrt(BRACKET_PAIRS * q * (1 - q)) + 2
        below = sample[max(0, int(q * BRACKET_PAIRS - spread))]
        above = sample[min(BRACKET_PAIRS - 1, int(q * BRACKET_PAIRS + spread))]
        if lo < below and _count_at_most(canary_sorted, stable_sorted, below) < rank:
            lo = float(below)
        if above < hi and _count_at_most(canary_sorted, stable_sorted, above) >= rank:
            hi = float(above)
    while hi - lo > eps:
        mid = 0.5 * (lo + hi)
        if _count_at_most(canary_sorted, stable_sorted, mid) >= rank:
            hi = mid
        else:
            lo = mid
    while True:  # snap to the exact difference: the smallest one above lo, until the count reaches rank
        d = _smallest_above(canary_sorted, stable_sorted, lo)
        if _count_at_most(canary_sorted, stable_sorted, d) >= rank:
            return d
        lo = d


def _smallest_above(canary_sorted: np.ndarray, stable_sorted: np.ndarray, lo: float) -> float:
    """The smallest pairwise difference canary_i - stable_j greater than ``lo``."""
    j = np.searchsorted(stable_sorted, canary_sorted - lo, side="left") - 1  # largest stable_j < canary_i - lo
    ok = j >= 0
    d = canary_sorted[ok] - stable_sorted[j[ok]]
    d = d[d > lo]  # rounding: x - lo > y does not always give x - y > lo
    if d.size == 0:  # ... then the next candidate of each canary value
        return float(np.nextafter(lo, np.inf))
    return float(d.min())


def _sorted(values: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(values, dtype=np.float64))


def hodges_lehmann(canary: np.ndarray, stable: np.ndarray) -> float:
    """The Hodges–Lehmann shift: the median of all pairwise differences canary - stable (the upper median
    for an even count of pairs)."""
    x, y = _sorted(canary), _sorted(stable)
    return _order_statistic(x, y, x.size * y.size // 2 + 1)


def hodges_lehmann_interval(canary: np.ndarray, stable: np.ndarray, confidence: float) -> tuple[float, float]:
    """Moser's distribution-free interval of the shift: the pairwise differences at the Mann–Whitney critical
    ranks (normal approximation)."""
    x, y = _sorted(canary), _sorted(stable)
    n1, n2 = x.size, y.size
    pairs = n1 * n2
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    k = min(max(int(math.floor(pairs / 2 - z * math.sqrt(pairs * (n1 + n2 + 1) / 12.0))), 0), pairs // 2)
    return _order_statistic(x, y, k + 1), _order_statistic(x, y, pairs - k)


def compare_proportions(canary_hits: float, canary_n: float, stable_hits: float, stable_n: float,
                        confidence: float) -> Comparison:
    """Difference of two proportions (canary - stable): pooled two-sided z-test, Wald interval. ``n`` may be
    an effective sample size (Kish) and ``hits`` its share of it, for weighted (sampled) flags."""
    p1, p2 = canary_hits / canary_n, stable_hits / stable_n
    pooled = (canary_hits + stable_hits) / (canary_n + stable_n)
    se0 = math.sqrt(max(pooled * (1 - pooled), 0.0) * (1 / canary_n + 1 / stable_n))
    diff = p1 - p2
    if se0 == 0.0:  # both sides all 0 or all 1: no evidence of a difference
        p_value = 1.0 if diff == 0 else 0.0
    else:
        p_value = float(2 * stats.norm.sf(abs(diff) / se0))
    se = math.sqrt(p1 * (1 - p1) / canary_n + p2 * (1 - p2) / stable_n)
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    return Comparison(diff, diff - z * se, diff + z * se, p_value)


def alpha_spent(information: float, alpha: float) -> float:
    """Lan–DeMets O'Brien–Fleming-type spending: the share of ``alpha`` spent by information fraction
    ``information`` (elapsed / bake). Spends almost nothing early, so an early fail needs a clear effect."""
    t = min(max(information, 0.0), 1.0)
    if t == 0.0:
        return 0.0
    return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(t)))
