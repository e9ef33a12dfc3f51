"""A NAB-only anomaly scorer built on the fleet ``Detector`` (``core.py``), which it leaves unchanged.

``NabDetector.update(t, x)`` returns an anomaly score in [0, 1] for one point, streaming: O(1) time and memory per
point, no look-ahead (it never sees a file's minimum, maximum or length; only what came before the point).

Three stages, then a rest period:

1. The ``Detector``'s z (Holt level, time-of-day profile, robust spread) through the anomaly-likelihood formula of
   ``core.Likelihood``: how unusual the recent |z| is against this series' own long-run |z|.
2. Value novelty (the idea behind Numenta HTM's spatial-anomaly check on NAB, and behind HTM / CAD OSE's
   quantised encoders): after ``probation`` points, a value beyond the running minimum / maximum *seen so far*
   by more than ``tolerance`` of that running range scores ``novel_score``.
3. A rest period: after a score of ``gate`` or more, ``rest`` points score 0 (one anomaly scores once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .core import Detector, DetectorParams, Likelihood


@dataclass(frozen=True)
class NabParams:
    detector: DetectorParams
    short_alpha: float = 0.25  # smoothing of the recent |z|
    long_alpha: float = 0.003  # smoothing of the long-run mean and variance of |z|
    min_points: int = 50  # points of |z| history before a likelihood is given
    z_cap: float = 1e9  # |z| is not capped in practice: a huge |z| widens the long-run spread (the series is
    # heavy-tailed), which keeps the likelihood from firing on its next bursts for a while
    probation: int = 300  # points before value novelty counts
    tolerance: float = 0.01  # a value this far (fraction of the running range) outside the range seen is novel
    novel_score: float = 1.0
    gate: float = 0.999  # a score this high starts the rest period
    rest: int = 90  # points after such a score that score 0


@dataclass
class NabDetector:
    det: Detector = field(default_factory=Detector)
    lik: Likelihood = field(default_factory=Likelihood)  # over the points with a z (after the Detector's warm-up)
    n: int = 0
    lo: float = math.inf
    hi: float = -math.inf
    quiet: int = 0

    def update(self, t: float, x: float, p: NabParams) -> float:
        z, _ = self.det.update(t, x, p.detector)
        if x != x or x in (math.inf, -math.inf):
            return 0.0
        self.n += 1
        self.quiet -= 1
        score = 0.0
        if self.det.n > p.detector.warmup:
            score = self.lik.score(z, p)  # NabParams carries the likelihood's settings under the same names
        if self.n > p.probation:
            tol = p.tolerance * (self.hi - self.lo)
            if x > self.hi + tol or x < self.lo - tol:
                score = max(score, p.novel_score)
        self.lo = min(self.lo, x)
        self.hi = max(self.hi, x)
        if self.quiet > 0:
            return 0.0
        if score >= p.gate:
            self.quiet = p.rest
        return score
