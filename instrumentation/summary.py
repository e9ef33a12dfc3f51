"""In-process latency summaries: TTFT, TPOT and the inter-token-latency summary from raw marks."""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import sub

NS = 1e9


@dataclass(slots=True, frozen=True)
class ItlSummary:
    count: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float


def nearest_rank(sorted_values: list[int], q: float) -> int:
    """The nearest-rank percentile (an observed value, never interpolated)."""
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def itl_summary(token_times_ns: list[int]) -> ItlSummary | None:
    """Summary of the gaps between consecutive token marks (sorted ascending), None with < 2 marks."""
    if len(token_times_ns) < 2:
        return None
    gaps = sorted(map(sub, token_times_ns[1:], token_times_ns))
    n = len(gaps)
    return ItlSummary(n, (token_times_ns[-1] - token_times_ns[0]) / n / NS, nearest_rank(gaps, 0.5) / NS,
                      nearest_rank(gaps, 0.9) / NS, nearest_rank(gaps, 0.99) / NS, gaps[-1] / NS)
