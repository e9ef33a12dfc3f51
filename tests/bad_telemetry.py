"""Telemetry that breaks the contract, one payload per kind, for the normalize tests (unit and on the
real stack): each comes with the field its dead-letter reason must name."""

from __future__ import annotations

import time

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from infersight.schemas import attributes as A

NOW = time.time_ns()


def make_span(**attrs) -> Span:
    span = Span(trace_id=bytes.fromhex("ab" * 16), span_id=b"\x01" * 8, name="llm_request",
                start_time_unix_nano=NOW - 2 * 10**9, end_time_unix_nano=NOW - 10**9)
    for key, value in attrs.items():
        key = key.replace("__", ".")
        v = (AnyValue(string_value=value) if isinstance(value, str) else AnyValue(int_value=value)
             if isinstance(value, int) else AnyValue(double_value=value))
        span.attributes.append(KeyValue(key=key, value=v))
    return span


def make_payload(*spans: Span, region: str | None = "us-east-1") -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    if region is not None:
        rs.resource.attributes.append(KeyValue(key=A.CLOUD_REGION, value=AnyValue(string_value=region)))
    rs.scope_spans.add().spans.extend(spans)
    return req.SerializeToString()


OK = {A.E2E: 0.5, A.GEN_AI_REQUEST_MODEL: "m", A.TTFT: 0.1, A.GEN_AI_USAGE_OUTPUT_TOKENS: 3}


def bad_payload(kind: str) -> tuple[bytes, str]:
    """One bad payload of each kind the issue names, and the field its DLQ reason must name."""
    if kind == "truncated protobuf":
        return make_payload(make_span(**OK))[:-7], "payload"
    span = make_span(**OK)
    if kind == "wrong attribute type":
        span = make_span(**{**OK, A.TTFT: "fast"})
        return make_payload(span), A.TTFT
    if kind == "missing timestamps":
        span.start_time_unix_nano = 0
        return make_payload(span), "start_time_unix_nano"
    if kind == "end before start":
        span.end_time_unix_nano = span.start_time_unix_nano - 1
        return make_payload(span), "end_time_unix_nano"
    if kind == "far future":
        span.start_time_unix_nano, span.end_time_unix_nano = NOW + 10**13, NOW + 10**13 + 10**9
        return make_payload(span), "end_time_unix_nano"
    if kind == "far past":
        span.start_time_unix_nano, span.end_time_unix_nano = NOW - 10**15, NOW - 10**15 + 10**9
        return make_payload(span), "start_time_unix_nano"
    if kind == "huge attribute value":
        return make_payload(make_span(**{**OK, A.GEN_AI_REQUEST_MODEL: "m" * 100_000})), A.GEN_AI_REQUEST_MODEL
    if kind == "unknown engine":
        return make_payload(make_span(**{**OK, A.ENGINE: "warp-drive"})), A.ENGINE
    if kind == "no region":
        return make_payload(span, region=None), A.CLOUD_REGION
    if kind == "contract violation":  # decodes fine, breaks the record's own rules
        return make_payload(make_span(**{**OK, A.TTFT: 9.0})), "ttft_s"
    raise AssertionError(kind)


KINDS = ("truncated protobuf", "wrong attribute type", "missing timestamps", "end before start", "far future",
         "far past", "huge attribute value", "unknown engine", "no region", "contract violation")
