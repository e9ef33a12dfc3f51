"""Sampling-weighted quality estimates, mergeable across windows, pods and regions.

A judged request sampled at rate ``p`` stands for ``1 / p`` requests (its weight). The mean score is the
Hajek (ratio) estimator ``sum(w y) / sum(w)``; its variance the usual linearisation
``sum(w^2 (y - mean)^2) / sum(w)^2`` (Poisson sampling with small rates, so the finite-population factor
``1 - p`` is left out: the interval is slightly conservative). Written by hand because the library
estimators at hand treat weights as frequencies (statsmodels' ``DescrStatsW`` would count a request sampled
at 1 % as 100 observations and make the interval ten times too narrow). Everything is kept as sums, so two
accumulators merge by adding them, and the estimate of the merge is the estimate of the union.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from scipy import special

from infersight.schemas.quality import DEFAULT_COMPOSITE_WEIGHTS, GUARDRAILS, LOWER_IS_BETTER, PASS_THRESHOLD


@dataclass
class WeightedMean:
    """Sums for the weighted mean of ``y`` with weights ``1 / sample_rate``. ``n`` counts raw samples."""

    n: int = 0
    sw: float = 0.0
    swy: float = 0.0
    sw2: float = 0.0
    sw2y: float = 0.0
    sw2y2: float = 0.0

    def add(self, y: float, sample_rate: float) -> None:
        if not 0.0 < sample_rate <= 1.0 or not math.isfinite(y):
            raise ValueError(f"sample_rate must be in (0, 1] and y finite, got rate {sample_rate!r}, y {y!r}")
        w = 1.0 / sample_rate
        self.n += 1
        self.sw += w
        self.swy += w * y
        self.sw2 += w * w
        self.sw2y += w * w * y
        self.sw2y2 += w * w * y * y

    def add_many(self, ys: np.ndarray, sample_rates: np.ndarray) -> None:
        """Vectorised ``add`` (the benchmark's and the simulator's path)."""
        w = 1.0 / np.asarray(sample_rates, dtype=float)
        y = np.asarray(ys, dtype=float)
        self.n += int(y.size)
        self.sw += float(w.sum())
        self.swy += float((w * y).sum())
        self.sw2 += float((w * w).sum())
        self.sw2y += float((w * w * y).sum())
        self.sw2y2 += float((w * w * y * y).sum())

    def merge(self, other: WeightedMean) -> WeightedMean:
        return WeightedMean(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def mean(self) -> float | None:
        return self.swy / self.sw if self.sw > 0 else None

    @property
    def weighted_count(self) -> float:
        """The estimated number of requests the samples stand for."""
        return self.sw

    def stderr(self) -> float | None:
        if self.n < 2 or self.sw <= 0:
            return None
        m = self.swy / self.sw
        ss = max(0.0, self.sw2y2 - 2.0 * m * self.sw2y + m * m * self.sw2)
        return math.sqrt(ss * self.n / (self.n - 1)) / self.sw

    def interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """A two-sided Student-t interval around the mean (None under two samples)."""
        se = self.stderr()
        if se is None:
            return None
        half = float(special.stdtrit(self.n - 1, 0.5 + confidence / 2.0)) * se  # Student-t quantile
        m = self.swy / self.sw
        return m - half, m + half

    def to_state(self) -> list[float]:
        return [getattr(self, f.name) for f in fields(self)]

    @classmethod
    def from_state(cls, state: list[float]) -> WeightedMean:
        return cls(int(state[0]), *state[1:])


def passes(evaluator: str, score: float) -> bool:
    """A scored evaluation passes at or above ``PASS_THRESHOLD`` (at or below it where lower is better)."""
    return score <= PASS_THRESHOLD if evaluator in LOWER_IS_BETTER else score >= PASS_THRESHOLD


@dataclass
class EvaluatorWindow:
    """One evaluator's sums in one window of one series: the score and the pass indicator."""

    score: WeightedMean
    passed: WeightedMean

    @classmethod
    def empty(cls) -> EvaluatorWindow:
        return cls(WeightedMean(), WeightedMean())

    def add(self, evaluator: str, score: float, sample_rate: float) -> None:
        self.score.add(score, sample_rate)
        self.passed.add(1.0 if passes(evaluator, score) else 0.0, sample_rate)

    def merge(self, other: EvaluatorWindow) -> EvaluatorWindow:
        return EvaluatorWindow(self.score.merge(other.score), self.passed.merge(other.passed))


def composite(means: Mapping[str, float | None], weights: Mapping[str, float] | None = None) -> float | None:
    """The composite quality score (0..1, 1 best): the weighted mean of the dimensions present, each oriented so
    that 1 is best (``1 - x`` for lower-is-better evaluators and guardrail flag rates). None when no weighted
    dimension is present."""
    weights = DEFAULT_COMPOSITE_WEIGHTS if weights is None else weights
    total = acc = 0.0
    for dim, wt in weights.items():
        m = means.get(dim)
        if m is None or wt <= 0:
            continue
        acc += wt * ((1.0 - m) if dim in LOWER_IS_BETTER else m)
        total += wt
    return acc / total if total > 0 else None


def summarise(evaluators: Mapping[str, EvaluatorWindow], weights: Mapping[str, float] | None = None,
              confidence: float = 0.95) -> dict[str, Any]:
    """The per-window quality record body of one series: per evaluator the weighted mean with its interval,
    the pass rate (scored evaluators) or flag rate (guardrails), samples and the requests they stand for;
    and the composite."""
    out: dict[str, Any] = {"evaluators": {}, "composite": None}
    means: dict[str, float | None] = {}
    for name in sorted(evaluators):
        ev = evaluators[name]
        ci = ev.score.interval(confidence)
        body: dict[str, Any] = {
            "mean": ev.score.mean, "ci_low": ci[0] if ci else None, "ci_high": ci[1] if ci else None,
            "samples": ev.score.n, "weighted_requests": ev.score.weighted_count,
        }
        if name in GUARDRAILS:
            body["flag_rate"] = ev.score.mean
        else:
            body["pass_rate"] = ev.passed.mean
        out["evaluators"][name] = body
        means[name] = ev.score.mean
    out["composite"] = composite(means, weights)
    return out
