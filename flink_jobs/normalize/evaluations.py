"""Evaluation records from OTLP span batches (issue #17): every ``gen_ai.evaluation.result`` event, on a request
span (judged before it finished) or on the small ``gen_ai.evaluation`` child span of a late result, becomes one
``schemas.evaluation`` record keyed to the request span by trace and span id. Invalid ones come back as
problem lists for the dead-letter queue. Pure; a module of its own beside the request-record decoder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from infersight.flink_jobs.normalize.otlp_spans import any_value
from infersight.flink_jobs.normalize.span_records import TimeBounds
from infersight.schemas import attributes as A
from infersight.schemas.evaluation import LATE_EVALUATION_SPAN, validate
from infersight.schemas.metrics import GEN_AI_EVALUATION_RESULT
from infersight.schemas.records import dump_batch
from infersight.schemas.topics import DLQ, EVALUATIONS
from infersight.schemas.units import MS, NS

_MARKER = GEN_AI_EVALUATION_RESULT.encode()


def _str(attrs: dict[str, Any], *names: str) -> str:
    for n in names:
        v = attrs.get(n)
        if isinstance(v, str) and v:
            return v
    return ""


def _time_problem(time_ns: Any, now_ns: int, bounds: TimeBounds) -> str | None:
    """As for request records: a result far in the future or older than the bounds is a clock error."""
    if not isinstance(time_ns, int):
        return None  # validate() names it
    ahead_s = (time_ns - now_ns) / NS
    if ahead_s > bounds.max_future_s:
        return f"time_ns: {ahead_s:.0f} s in the future (limit {bounds.max_future_s:.0f} s)"
    if -ahead_s > bounds.max_age_s:
        return f"time_ns: {-ahead_s:.0f} s in the past (limit {bounds.max_age_s:.0f} s)"
    return None


def evaluations_from_payload(payload: bytes, now_ns: int | None = None, bounds: TimeBounds | None = None
                             ) -> Iterator[dict[str, Any] | tuple[str | None, list[str]]]:
    """Per evaluation event: its record (a dict, valid) or ``(trace_id, problems)``. With ``now_ns``, a time
    outside ``bounds`` (default: the request records' ``TimeBounds``) is a problem too.

    Raises ``google.protobuf.message.DecodeError`` on bytes that are not an OTLP trace request."""
    request = ExportTraceServiceRequest.FromString(payload)
    for rs in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                events = [e for e in span.events if e.name == GEN_AI_EVALUATION_RESULT]
                if not events:
                    continue
                attrs = {kv.key: any_value(kv.value) for kv in span.attributes}
                late = span.name == LATE_EVALUATION_SPAN
                request_span = span.parent_span_id if late else span.span_id
                for ev in events:
                    ea = {kv.key: any_value(kv.value) for kv in ev.attributes}
                    rec = {
                        "trace_id": span.trace_id.hex(), "span_id": request_span.hex(),
                        "time_ns": ev.time_unix_nano or span.end_time_unix_nano,
                        "region": _str(resource, A.CLOUD_REGION),
                        "name": ea.get(A.GEN_AI_EVALUATION_NAME),
                        "sample_rate": ea.get(A.EVALUATION_SAMPLE_RATE),
                        "score": ea.get(A.GEN_AI_EVALUATION_SCORE_VALUE),
                        "label": ea.get(A.GEN_AI_EVALUATION_SCORE_LABEL),
                        "model": _str({**resource, **attrs}, A.GEN_AI_RESPONSE_MODEL, A.GEN_AI_REQUEST_MODEL),
                        "model_version": _str({**resource, **attrs}, A.MODEL_VERSION),
                        "track": _str({**resource, **attrs}, A.DEPLOYMENT_TRACK),
                    }
                    problems = validate(rec)
                    if now_ns is not None:
                        late = _time_problem(rec["time_ns"], now_ns, bounds or TimeBounds())
                        problems += [late] if late else []
                    yield (rec["trace_id"], problems) if problems else rec


def evaluation_outputs(payload: bytes, letter: Callable[[str, list[str], str | None], str], now_ns: int,
                       bounds: TimeBounds | None = None) -> Iterator[tuple[str, str, int]]:
    """``(output topic, JSON value, event time ms)``: the valid records of one OTLP trace payload as one batch on
    ``infersight.evaluations``, a dead letter (``letter(reason, problems, trace_id)``) per invalid one. A payload
    without the event's name among its bytes has none: it is not decoded a second time (the cost of the request
    records' path stays as it was)."""
    if _MARKER not in payload:
        return
    now_ms = now_ns // MS
    batch = []
    for item in evaluations_from_payload(payload, now_ns, bounds):
        if isinstance(item, dict):
            batch.append(item)
        else:
            trace_id, problems = item
            yield DLQ.name, letter("evaluation " + "; ".join(problems), problems, trace_id), now_ms
    if batch:
        yield EVALUATIONS.name, dump_batch(batch), max(r["time_ns"] for r in batch) // MS
