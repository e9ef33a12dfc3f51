"""Client-call records from OTLP span batches (issue #22, ``schemas/client_calls.py``): a client half per span
carrying ``infersight.client.ttft`` (the OpenAI client instrumentation's CLIENT span), a server half per
request record whose span has a parent. The metrics job joins the two by trace. A client span is never a
request record (``span_records.source_of`` does not take it); one that breaks the contract becomes a dead
letter naming the field. Pure; a module of its own beside the request-record decoder."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from infersight.flink_jobs.normalize.otlp_spans import any_value
from infersight.flink_jobs.normalize.span_records import TimeBounds
from infersight.schemas import attributes as A
from infersight.schemas import client_calls as C
from infersight.schemas.records import dump_batch
from infersight.schemas.topics import CLIENT_CALLS, DLQ
from infersight.schemas.units import MS, NS

_MARKER = A.CLIENT_TTFT.encode()
MAX_BATCH = 1000  # as the request records' batches: under the producer's 1 MB


def _model(attrs: dict[str, Any]) -> Any:
    for name in (A.GEN_AI_REQUEST_MODEL, A.GEN_AI_RESPONSE_MODEL):
        value = attrs.get(name)
        if value is not None:
            return value
    return None


def _time_problems(start: int, end: int, now_ns: int, bounds: TimeBounds) -> list[str]:
    """As for request records: a span far in the future or older than the bounds is a clock error."""
    out = []
    if start == 0:
        out.append("start_time_unix_nano: missing")
    if end == 0:
        out.append("end_time_unix_nano: missing")
    if end and end > now_ns + bounds.max_future_s * NS:
        out.append(f"end_time_unix_nano: {(end - now_ns) / NS:.0f} s in the future "
                   f"(limit {bounds.max_future_s:.0f} s)")
    if start and start < now_ns - bounds.max_age_s * NS:
        out.append(f"start_time_unix_nano: {(now_ns - start) / NS:.0f} s in the past "
                   f"(limit {bounds.max_age_s:.0f} s)")
    return out


def client_half(span: Any, resource: dict[str, Any], now_ns: int, bounds: TimeBounds) -> dict[str, Any] | list[str]:
    """The client half of one span carrying ``infersight.client.ttft``, or its problems (each naming the OTLP
    field or attribute at fault)."""
    attrs = {kv.key: any_value(kv.value) for kv in span.attributes}
    ttft = attrs.get(A.CLIENT_TTFT)
    problems = _time_problems(span.start_time_unix_nano, span.end_time_unix_nano, now_ns, bounds)
    if isinstance(ttft, bool) or not isinstance(ttft, int | float):
        problems.append(f"{A.CLIENT_TTFT}: expected double, got {type(ttft).__name__} {str(ttft)[:40]!r}")
        ttft = None
    model = _model(attrs)
    if model is None:
        problems.append(f"{A.GEN_AI_REQUEST_MODEL}: missing on a span carrying {A.CLIENT_TTFT}")
    region = resource.get(A.CLOUD_REGION)
    record = {"side": C.CLIENT, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
              "parent_span_id": span.parent_span_id.hex(), "model": model,
              "region": region if isinstance(region, str) and region else None,
              "start_ns": span.start_time_unix_nano, "end_ns": span.end_time_unix_nano,
              "ttft_s": float(ttft) if ttft is not None else None}
    if problems:  # the fields' own problems would repeat these
        return problems
    problems = C.problems(record)
    for i, p in enumerate(problems):  # in the span's words
        problems[i] = p.replace("ttft_s:", f"{A.CLIENT_TTFT}:", 1).replace("model:", f"{A.GEN_AI_REQUEST_MODEL}:", 1)
    return problems or record


def server_half(record: dict[str, Any], parent_span_id: str) -> dict[str, Any]:
    """The server half of a (valid) request record whose span's parent is ``parent_span_id``."""
    return {"side": C.SERVER, "trace_id": record["trace_id"], "span_id": record["span_id"],
            "parent_span_id": parent_span_id, "model": record["model"], "region": record["region"],
            "start_ns": record["start_ns"], "end_ns": record["end_ns"], "ttft_s": record["ttft_s"]}


def _alone(resource_spans: Any, scope_spans: Any, span: Any) -> bytes:
    """The span alone, with its resource and scope: what its dead letter carries."""
    single = ExportTraceServiceRequest()
    rs = single.resource_spans.add()
    rs.resource.CopyFrom(resource_spans.resource)
    ss = rs.scope_spans.add()
    ss.scope.CopyFrom(scope_spans.scope)
    ss.spans.add().CopyFrom(span)
    return single.SerializeToString()


def client_halves(payload: bytes, now_ns: int, bounds: TimeBounds | None = None
                  ) -> Iterator[dict[str, Any] | tuple[str, list[str], bytes]]:
    """Per span carrying ``infersight.client.ttft``: its client half, or ``(trace_id, problems, span bytes)``.
    A payload without the attribute's name among its bytes has none and is not decoded again.

    Raises ``google.protobuf.message.DecodeError`` on bytes that are not an OTLP trace request."""
    if _MARKER not in payload:
        return
    bounds = bounds or TimeBounds()
    request = ExportTraceServiceRequest.FromString(payload)
    for rs in request.resource_spans:
        resource = None
        for ss in rs.scope_spans:
            for span in ss.spans:
                if not any(kv.key == A.CLIENT_TTFT for kv in span.attributes):
                    continue
                if resource is None:
                    resource = {kv.key: any_value(kv.value) for kv in rs.resource.attributes}
                result = client_half(span, resource, now_ns, bounds)
                if isinstance(result, dict):
                    yield result
                else:
                    yield span.trace_id.hex(), result, _alone(rs, ss, span)


def client_call_outputs(payload: bytes, records: list[dict[str, Any]], parents: dict[tuple[str, str], str],
                        letter: Callable[[str, list[str], bytes, str], str], now_ns: int,
                        bounds: TimeBounds | None = None) -> Iterator[tuple[str, str, int]]:
    """``(output topic, JSON value, event time ms)``: the client and server halves of one OTLP trace payload as
    batches on ``infersight.client_calls`` (``records``: its request records; ``parents``: (trace id, span id)
    -> parent span id of those whose span has one), a dead letter (``letter(reason, problems, span bytes,
    trace_id)``) per malformed client span."""
    halves = []
    if parents:
        for record in records:
            parent = parents.get((record["trace_id"], record["span_id"]))
            if parent:
                halves.append(server_half(record, parent))
    now_ms = now_ns // MS
    for item in client_halves(payload, now_ns, bounds):
        if isinstance(item, dict):
            halves.append(item)
        else:
            trace_id, problems, span_bytes = item
            yield DLQ.name, letter("client span: " + "; ".join(problems), problems, span_bytes, trace_id), now_ms
    for lo in range(0, len(halves), MAX_BATCH):
        chunk = halves[lo:lo + MAX_BATCH]
        yield CLIENT_CALLS.name, dump_batch(chunk), max(h["end_ns"] for h in chunk) // MS
