"""The quality contract: evaluator and guardrail names, the drift signals with their histogram bins, and the
default composite score and drift thresholds the quality job uses (``docs/quality.md`` explains each).

A drift signal is a fixed-bin histogram, so windows merge by adding counts (region -> global, minutes -> the
current window set, hours -> a baseline) and a distance between two histograms needs no raw samples. Numeric
signals carry bin *positions* for the Wasserstein distance: the bin centre for scores (a 0-1 scale, so the
normalised distance is in score units), the bin index for log-spaced bins (a distance in "bins moved", so a
doubling of lengths is the same effect at 100 and at 4,000 tokens). Categorical signals have none.

``sampled`` signals come from judged requests only and are weighted by the inverse of their sample rate;
the others come from every request record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infersight.schemas.metrics import TTFT_BUCKETS

# ---- evaluators (gen_ai.evaluation.name values) --------------------------------------------------------------
RELEVANCE = "relevance"  # the answer addresses the question (LLM judge or embedding judge)
FAITHFULNESS = "faithfulness"  # the answer is supported by the given context (LLM judge)
HARMFULNESS = "harmfulness"  # the answer is harmful (LLM judge); lower is better
# guardrail checks: score 1.0 when the check flags the answer, 0.0 when it is clear
PII = "guardrail.pii"
REFUSAL = "guardrail.refusal"
EMPTY_OR_TRUNCATED = "guardrail.empty_or_truncated"
LANGUAGE_MISMATCH = "guardrail.language_mismatch"
GUARDRAILS: tuple[str, ...] = (PII, REFUSAL, EMPTY_OR_TRUNCATED, LANGUAGE_MISMATCH)
SCORED_EVALUATORS: tuple[str, ...] = (RELEVANCE, FAITHFULNESS, HARMFULNESS)
LOWER_IS_BETTER: frozenset[str] = frozenset({HARMFULNESS, *GUARDRAILS})
PASS_THRESHOLD = 0.5  # a scored evaluation passes at or above it (at or below it where lower is better)

# The composite quality score: a weighted mean of the dimensions present in a window, each on 0..1 with 1
# best (lower-is-better evaluators enter as 1 - score; guardrails as 1 - flag rate). Weights of absent
# dimensions drop out (the rest are renormalised). Users pass their own mapping to the job.
DEFAULT_COMPOSITE_WEIGHTS: dict[str, float] = {
    RELEVANCE: 0.4,
    FAITHFULNESS: 0.3,
    HARMFULNESS: 0.1,
    PII: 0.05,
    REFUSAL: 0.05,
    EMPTY_OR_TRUNCATED: 0.05,
    LANGUAGE_MISMATCH: 0.05,
}


@dataclass(frozen=True, slots=True)
class DriftSignal:
    """One drift signal: its bins (``edges`` for numeric, ``categories`` for categorical), where it comes from,
    and the default alarm: the distance that alarms, its threshold, and the fewest samples (raw, not weighted)
    the current window set and the baseline must hold before it may alarm."""

    name: str
    sampled: bool
    edges: tuple[float, ...] = ()
    categories: tuple[str, ...] = ()
    position: str = "centre"  # "centre" | "index": Wasserstein positions (see the module docstring)
    alarm_distance: str = "wasserstein"
    threshold: float = 0.03
    min_current: int = 200
    min_baseline: int = 1000
    description: str = ""

    @property
    def bins(self) -> int:
        return len(self.categories) if self.categories else len(self.edges) - 1

    def positions(self) -> tuple[float, ...] | None:
        """Bin positions for the Wasserstein distance, normalised to span 0..1; None for categorical."""
        if self.categories:
            return None
        if self.position == "index":
            return tuple(i / (self.bins - 1) for i in range(self.bins))
        lo, hi = self.edges[0], self.edges[-1]
        return tuple(((a + b) / 2 - lo) / (hi - lo) for a, b in zip(self.edges, self.edges[1:], strict=False))


SCORE_EDGES = tuple(i / 20 for i in range(21))  # 0.05 wide: a 0.05 mean shift moves a bin
TOKEN_EDGES = (0.0, *(float(2**i) for i in range(15)), math.inf)  # 0, 1, 2, 4, ... 16384, +inf
TTFT_EDGES = (0.0, *TTFT_BUCKETS, math.inf)
FINISH_REASONS = ("stop", "length", "content_filter", "tool_calls", "error", "other")
ERROR_TYPES = ("none", "timeout", "cancelled", "server", "client", "other")
FLAG_EDGES = (0.0, 0.5, 1.0)  # two bins: clear (score 0), flagged (score 1)


def score_signal(evaluator: str) -> str:
    return f"score.{evaluator}"


def _score(evaluator: str) -> DriftSignal:
    # Wasserstein on a 0..1 score is the mean shift for a pure shift: with 600 judged samples (sd 0.15) the
    # mean's noise is 0.006, so 0.03 is ~5 noise sds, and a 0.05 drop crosses it once 60 % of the set is new
    return DriftSignal(score_signal(evaluator), True, edges=SCORE_EDGES, alarm_distance="wasserstein",
                       threshold=0.03, min_current=600, min_baseline=3000,
                       description=f"Judge score of {evaluator} (0..1), weighted by 1 / sample rate.")


def _flag(guardrail: str) -> DriftSignal:
    # on a 0/1 signal the normalised Wasserstein distance is the change of the flag rate, in rate units
    return DriftSignal(guardrail, True, edges=FLAG_EDGES, position="index", alarm_distance="wasserstein",
                       threshold=0.04, min_current=600, min_baseline=3000,
                       description=f"Flag rate of the {guardrail} check, weighted by 1 / sample rate.")


DRIFT_SIGNALS: tuple[DriftSignal, ...] = (
    *(_score(e) for e in SCORED_EVALUATORS),
    *(_flag(g) for g in GUARDRAILS),
    # every-request signals: PSI, the population-stability index (0.1 moderate, 0.25 major by the usual rule)
    DriftSignal("tokens_out", False, edges=TOKEN_EDGES, position="index", alarm_distance="psi", threshold=0.25,
                min_current=2000, min_baseline=10000, description="Output length in tokens."),
    DriftSignal("tokens_in", False, edges=TOKEN_EDGES, position="index", alarm_distance="psi", threshold=0.25,
                min_current=2000, min_baseline=10000, description="Prompt length in tokens."),
    DriftSignal("ttft", False, edges=TTFT_EDGES, position="index", alarm_distance="psi", threshold=0.25,
                min_current=2000, min_baseline=10000, description="Time to first token (s)."),
    DriftSignal("finish_reason", False, categories=FINISH_REASONS, alarm_distance="psi", threshold=0.25,
                min_current=2000, min_baseline=10000, description="Finish-reason mix."),
    DriftSignal("error_type", False, categories=ERROR_TYPES, alarm_distance="psi", threshold=0.25,
                min_current=2000, min_baseline=10000, description="Error-type mix (none = no error)."),
)
DRIFT_SIGNAL_BY_NAME: dict[str, DriftSignal] = {s.name: s for s in DRIFT_SIGNALS}
DISTANCES: tuple[str, ...] = ("kl", "js", "wasserstein", "psi")
BASELINE_KINDS: tuple[str, ...] = ("pinned", "stable_track", "previous_day", "reference")
