"""What a canary is judged on: each metric's record field, direction, tolerance, minimum sample size and
whether it is critical (a critical metric failing fails the canary; a non-critical one makes it marginal)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Record = dict[str, Any]


def _field(name: str) -> Callable[[Record], float | None]:
    def get(record: Record) -> float | None:
        value = record.get(name)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
    return get


def _tpot(record: Record) -> float | None:
    decode, out = record.get("decode_s"), record.get("tokens_out")
    if isinstance(decode, int | float) and isinstance(out, int) and out > 1:
        return float(decode) / (out - 1)
    return None


def _output_tokens(record: Record) -> float | None:
    out = record.get("tokens_out")  # a failed request's output is cut short: judged by the error ratio instead
    return float(out) if isinstance(out, int) and out > 0 and not record.get("error_type") else None


def _errored(record: Record) -> float | None:
    return 1.0 if record.get("error_type") else 0.0


def _flag(name: str) -> Callable[[Record], float | None]:
    def get(record: Record) -> float | None:
        value = record.get(name)
        return None if value is None else float(bool(value))
    return get


@dataclass(frozen=True)
class MetricSpec:
    """``kind``: ``rank`` (Mann–Whitney U + Hodges–Lehmann on per-request values) or ``proportion``.
    ``relative``: compared on the log scale, so the shift and ``tolerance`` are relative changes (0.05 = 5 %);
    otherwise absolute (quality score points, proportion points). ``worse``: the direction that fails."""

    name: str
    kind: Literal["rank", "proportion"]
    extract: Callable[[Record], float | None]
    worse: Literal["higher", "lower", "either"]
    tolerance: float
    min_samples: int
    critical: bool
    relative: bool = False
    sample_rate_field: str = ""  # per-request sample rate (a sampled judge): weight = 1 / rate


DEFAULT_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("ttft_s", "rank", _field("ttft_s"), "higher", 0.05, 200, True, relative=True),
    MetricSpec("e2e_s", "rank", _field("e2e_s"), "higher", 0.05, 200, True, relative=True),
    MetricSpec("itl_s", "rank", _field("itl_p50_s"), "higher", 0.05, 200, False, relative=True),
    MetricSpec("tpot_s", "rank", _tpot, "higher", 0.05, 200, False, relative=True),
    MetricSpec("error_ratio", "proportion", _errored, "higher", 0.005, 1000, True),
    MetricSpec("output_tokens", "rank", _output_tokens, "either", 0.10, 200, False, relative=True),
    MetricSpec("quality_score", "rank", _field("quality_score"), "lower", 0.02, 100, True,
               sample_rate_field="quality_sample_rate"),
    MetricSpec("guardrail_flag_ratio", "proportion", _flag("guardrail_flagged"), "higher", 0.005, 1000, True,
               sample_rate_field="quality_sample_rate"),
)
