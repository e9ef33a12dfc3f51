"""Evaluation records from OTLP span batches (issue #17): every ``gen_ai.evaluation.result`` event, on a request
span (judged before it finished) or on the small ``gen_ai.evaluation`` child span of a late result, becomes one
``schemas.evaluation`` record keyed to the request span by trace and span id. Invalid ones come back as
problem lists for the dead-letter queue. Pure; a module of its own beside the request-record decoder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from infersight.flink_jobs.normalize.otlp_spans import any_value
from infersight.schemas import attributes as A
from infersight.schemas.evaluation import LATE_EVALUATION_SPAN, validate
from infersight.schemas.metrics import GEN_AI_EVALUATION_RESULT
from infersight.schemas.records import dump_batch
from infersight.schemas.topics import DLQ, EVALUATIONS
from infersight.schemas.units import MS

_MARKER = GEN_AI_EVALUATION_RESULT.encode()


def _str(attrs: dict[str, Any], *names: str) -> str:
    for n in names:
        v = attrs.get(n)
        if isinstance(v, str) and v:
            return v
    return ""


def evaluations_from_payload(payload: bytes) -> Iterator[dict[str, Any] | tuple[str | None, list[str]]]:
    """Per evaluation event: its record (a dict, valid) or ``(trace_id, problems)``.

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
                    yield (rec["trace_id"], problems) if problems else rec


def evaluation_outputs(payload: bytes, letter: Callable[[str, list[str], str | None], str], now_ms: int
                       ) -> Iterator[tuple[str, str, int]]:
    """``(output topic, JSON value, event time ms)``: the valid records of one OTLP trace payload as one batch on
    ``infersight.evaluations``, a dead letter (``letter(reason, problems, trace_id)``) per invalid one. A payload
    without the event's name among its bytes has none: it is not decoded a second time (the cost of the request
    records' path stays as it was)."""
    if _MARKER not in payload:
        return
    batch = []
    for item in evaluations_from_payload(payload):
        if isinstance(item, dict):
            batch.append(item)
        else:
            trace_id, problems = item
            yield DLQ.name, letter("evaluation " + "; ".join(problems), problems, trace_id), now_ms
    if batch:
        yield EVALUATIONS.name, dump_batch(batch), max(r["time_ns"] for r in batch) // MS
