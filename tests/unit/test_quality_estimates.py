"""Sampling-weighted estimates: the weighted mean's interval covers the truth under mixed sample rates, the
unweighted mean misses it; sums merge; the composite score orients and renormalises its dimensions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infersight.flink_jobs.quality.estimates import EvaluatorWindow, WeightedMean, composite, passes, summarise
from infersight.schemas.quality import HARMFULNESS, PII, RELEVANCE


def _two_pods(seed: int) -> tuple[float, WeightedMean, np.ndarray]:
    """Two pods with equal traffic and different true means, judged at 1 % and 10 %."""
    rng = np.random.default_rng(seed)
    truth_parts, judged, est = [], [], WeightedMean()
    for rate, mean in ((0.01, 0.80), (0.10, 0.70)):
        ys = np.clip(rng.normal(mean, 0.15, 50_000), 0.0, 1.0)
        truth_parts.append(ys)
        keep = ys[rng.random(ys.size) < rate]
        est.add_many(keep, np.full(keep.size, rate))
        judged.append(keep)
    return float(np.concatenate(truth_parts).mean()), est, np.concatenate(judged)


def test_weighted_interval_covers_the_truth_and_the_unweighted_mean_misses_it():
    covered, unweighted_errors = 0, []
    seeds = range(100)
    for seed in seeds:
        truth, est, judged = _two_pods(seed)
        lo, hi = est.interval(0.95)
        covered += lo <= truth <= hi
        unweighted_errors.append(float(judged.mean()) - truth)
    assert covered / len(seeds) >= 0.9  # a 95 % interval: ~95 of 100, allowing sampling noise
    # the 10 % pod has 10x the samples and the lower mean: the plain mean is pulled towards it by ~0.04
    assert np.mean(unweighted_errors) < -0.03
    assert max(unweighted_errors) < 0  # and it misses in every seed, not on average


def test_weighted_mean_equals_the_truth_without_sampling():
    est = WeightedMean()
    est.add_many(np.array([0.2, 0.4, 0.9]), np.array([1.0, 1.0, 1.0]))
    assert est.mean == pytest.approx(0.5)
    assert est.weighted_count == pytest.approx(3.0)


def test_rates_weight_the_mean():
    est = WeightedMean()
    est.add(1.0, 0.5)  # stands for 2 requests
    est.add(0.0, 1.0)  # stands for 1
    assert est.mean == pytest.approx(2 / 3)


def test_merge_is_the_union():
    rng = np.random.default_rng(1)
    ys, rates = rng.random(300), rng.choice([0.01, 0.1, 1.0], 300)
    a, b, whole = WeightedMean(), WeightedMean(), WeightedMean()
    a.add_many(ys[:100], rates[:100])
    b.add_many(ys[100:], rates[100:])
    for y, r in zip(ys, rates, strict=True):
        whole.add(float(y), float(r))
    merged = a.merge(b)
    assert merged.n == whole.n == 300
    assert merged.mean == pytest.approx(whole.mean)
    assert merged.interval() == pytest.approx(whole.interval())
    assert WeightedMean.from_state(merged.to_state()) == merged


@pytest.mark.parametrize("rate,y", [(0.0, 0.5), (1.5, 0.5), (-0.1, 0.5), (0.1, math.nan)])
def test_bad_rate_or_score_is_refused_with_the_value(rate, y):
    with pytest.raises(ValueError, match="sample_rate"):
        WeightedMean().add(y, rate)


def test_no_interval_under_two_samples():
    est = WeightedMean()
    assert est.mean is None and est.interval() is None
    est.add(0.5, 0.1)
    assert est.interval() is None


def test_pass_direction_follows_the_evaluator():
    assert passes(RELEVANCE, 0.8) and not passes(RELEVANCE, 0.2)
    assert passes(HARMFULNESS, 0.1) and not passes(HARMFULNESS, 0.9)


def test_composite_orients_lower_is_better_and_renormalises_absent_dimensions():
    assert composite({RELEVANCE: 0.8}) == pytest.approx(0.8)
    assert composite({RELEVANCE: 0.8, PII: 0.1}, {RELEVANCE: 1.0, PII: 1.0}) == pytest.approx((0.8 + 0.9) / 2)
    assert composite({HARMFULNESS: 0.2}, {HARMFULNESS: 1.0}) == pytest.approx(0.8)
    assert composite({}) is None


def test_summary_reports_flag_rate_for_guardrails_and_pass_rate_for_scores():
    rel, pii = EvaluatorWindow.empty(), EvaluatorWindow.empty()
    for y in (0.9, 0.3, 0.7):
        rel.add(RELEVANCE, y, 0.1)
    for flagged in (1.0, 0.0, 0.0, 0.0):
        pii.add(PII, flagged, 0.1)
    out = summarise({RELEVANCE: rel, PII: pii})
    assert out["evaluators"][RELEVANCE]["pass_rate"] == pytest.approx(2 / 3)
    assert out["evaluators"][PII]["flag_rate"] == pytest.approx(0.25)
    r = out["evaluators"][RELEVANCE]
    assert r["ci_low"] < r["mean"] < r["ci_high"]
    assert r["weighted_requests"] == pytest.approx(30.0)
