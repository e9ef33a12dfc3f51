"""The evaluation record: one judge or guardrail result of one request, as normalize extracts it from a
``gen_ai.evaluation.result`` span event and the quality job reads it.

| field | type | meaning |
|---|---|---|
| ``trace_id`` | 32 hex | the request's trace |
| ``span_id`` | 16 hex | the request span's id (a late result's span's parent): joins it to its request record |
| ``time_ns`` | int | when the result was recorded (the event's time) |
| ``region`` | string | ``cloud.region`` of the resource (the gateway stamps it) |
| ``model``, ``model_version``, ``track`` | string | from the span or its resource; else empty (the join tells) |
| ``name`` | string | ``gen_ai.evaluation.name`` (``schemas.quality`` names ours) |
| ``score`` | float in 0..1 or null | ``gen_ai.evaluation.score.value``; null when the judge gave nothing usable |
| ``label`` | string or null | ``gen_ai.evaluation.score.label`` |
| ``sample_rate`` | float in (0, 1] | ``infersight.evaluation.sample_rate``: the estimate's weight is its inverse |
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

HEX32 = re.compile(r"[0-9a-f]{32}")
HEX16 = re.compile(r"[0-9a-f]{16}")
MAX_NAME_CHARS = 128
LATE_EVALUATION_SPAN = "gen_ai.evaluation"  # the child span a result recorded after its request finished rides on


@dataclass(frozen=True, slots=True)
class EvaluationRecord:
    trace_id: str
    span_id: str
    time_ns: int
    region: str
    name: str
    sample_rate: float
    score: float | None = None
    label: str | None = None
    model: str = ""
    model_version: str = ""
    track: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def validate(rec: dict[str, Any]) -> list[str]:
    """Every problem of an evaluation record, each naming its field (the dead letter's reason)."""
    problems = []
    if not isinstance(rec.get("trace_id"), str) or not HEX32.fullmatch(rec["trace_id"]) or not int(
            rec["trace_id"], 16):
        problems.append(f"trace_id {rec.get('trace_id')!r:.60} is not 32 lowercase hex digits, not all zero")
    if not isinstance(rec.get("span_id"), str) or not HEX16.fullmatch(rec["span_id"]) or not int(rec["span_id"], 16):
        problems.append(f"span_id {rec.get('span_id')!r:.40} is not 16 lowercase hex digits, not all zero")
    name = rec.get("name")
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
        problems.append(f"name {name!r:.60} must be a non-empty string of at most {MAX_NAME_CHARS} characters")
    rate = rec.get("sample_rate")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 < rate <= 1.0:
        problems.append(f"sample_rate {rate!r:.40} must be a number in (0, 1]")
    score = rec.get("score")
    if score is not None and (isinstance(score, bool) or not isinstance(score, int | float)
                              or not math.isfinite(score) or not 0.0 <= score <= 1.0):
        problems.append(f"score {score!r:.40} must be a number in [0, 1] or absent")
    if not isinstance(rec.get("time_ns"), int) or rec["time_ns"] <= 0:
        problems.append(f"time_ns {rec.get('time_ns')!r:.40} must be a positive integer")
    return problems
