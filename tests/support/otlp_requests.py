"""Per-request records -> OTLP root spans, encoded straight to protobuf (no SDK span objects).

The inverse of ``span_records`` for our own instrumentation's root span: the same span name and
attribute names (from ``schemas``), so the normaliser cannot tell these from SDK-emitted spans. Used by
the tests, the job benchmark and the fleet simulator, where the SDK's per-span cost would dominate.
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from infersight.schemas import attributes as A
from infersight.schemas.attributes import SCOPE_NAME, SCOPE_VERSION
from infersight.schemas.records import RequestRecord

_DOUBLES = ((A.E2E, "e2e_s"), (A.TTFT, "ttft_s"), (A.QUEUE_DURATION, "queue_s"), (A.PREFILL_DURATION, "prefill_s"),
            (A.DECODE_DURATION, "decode_s"), (A.ITL_MEAN, "itl_mean_s"), (A.ITL_P50, "itl_p50_s"),
            (A.ITL_P90, "itl_p90_s"), (A.ITL_P99, "itl_p99_s"), (A.ITL_MAX, "itl_max_s"))


def _kv(key: str, value: str | int | float) -> KeyValue:
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))


def root_span(record: RequestRecord, span_id: bytes, operation: str = "chat") -> Span:
    """The root span our instrumentation emits for this request."""
    span = Span(trace_id=bytes.fromhex(record.trace_id), span_id=span_id, name=f"{operation} {record.model}",
                kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=record.start_ns, end_time_unix_nano=record.end_ns)
    attrs = [_kv(A.GEN_AI_PROVIDER_NAME, record.engine), _kv(A.ENGINE, record.engine),
             _kv(A.DEPLOYMENT_TRACK, record.track), _kv(A.GEN_AI_OPERATION_NAME, operation),
             _kv(A.GEN_AI_REQUEST_MODEL, record.model),
             _kv(A.GEN_AI_USAGE_INPUT_TOKENS, record.tokens_in), _kv(A.GEN_AI_USAGE_OUTPUT_TOKENS, record.tokens_out)]
    if record.model_version:
        attrs.append(_kv(A.MODEL_VERSION, record.model_version))
    for key, field in _DOUBLES:
        value = getattr(record, field)
        if value is not None:
            attrs.append(_kv(key, float(value)))
    if record.itl_count:
        attrs.append(_kv(A.ITL_COUNT, record.itl_count))
    if record.tokens_cached:
        attrs.append(_kv(A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, record.tokens_cached))
    if record.finish_reason is not None:
        attrs.append(KeyValue(key=A.GEN_AI_RESPONSE_FINISH_REASONS, value=AnyValue(
            array_value=ArrayValue(values=[AnyValue(string_value=record.finish_reason)]))))
    if record.error_type is not None:
        attrs.append(_kv(A.ERROR_TYPE, record.error_type))
        span.status.code = Status.STATUS_CODE_ERROR
    span.attributes.extend(attrs)
    return span


def encode_requests(records: Iterable[RequestRecord], resource: dict[str, str] | None = None) -> bytes:
    """One ``ExportTraceServiceRequest`` holding the root spans of ``records`` (region from the records
    unless ``resource`` sets ``cloud.region``, as a gateway would)."""
    request = ExportTraceServiceRequest()
    by_region: dict[str, object] = {}
    for i, record in enumerate(records):
        region = (resource or {}).get(A.CLOUD_REGION, record.region)
        scope = by_region.get(region)
        if scope is None:
            rs = request.resource_spans.add()
            rs.resource.attributes.extend(_kv(k, v) for k, v in {**(resource or {}), A.CLOUD_REGION: region}.items())
            scope = rs.scope_spans.add()
            scope.scope.name, scope.scope.version = SCOPE_NAME, SCOPE_VERSION
            by_region[region] = scope
        span_id = bytes.fromhex(record.span_id) if record.span_id else (i + 1).to_bytes(8, "big")
        scope.spans.append(root_span(record, span_id))
    return request.SerializeToString()
