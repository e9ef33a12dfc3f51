"""Per-request records -> OTLP root spans, written straight to the wire format (no SDK span objects) with
the shared primitives of ``infersight.schemas.otlp_wire``.

The inverse of ``span_records`` for our own instrumentation's root span: the same span name and
attribute names (the contract's table), so the normaliser cannot tell these from SDK-emitted spans. Used by
the tests and the job benchmark, where the SDK's per-span cost would dominate.
"""

from __future__ import annotations

from collections.abc import Iterable

from infersight.schemas import attributes as A
from infersight.schemas import otlp_wire as w
from infersight.schemas.attributes import SCOPE_NAME, SCOPE_VERSION
from infersight.schemas.contract import BY_NAME, DOUBLE_ATTRIBUTES
from infersight.schemas.otlp_wire import SPAN_ATTRIBUTE, field, key_value
from infersight.schemas.records import RequestRecord

_SCOPE = field(w.SCOPE_SPANS_SCOPE, w.scope(SCOPE_NAME, SCOPE_VERSION))


def _attr(key: str | None, value: object) -> bytes:
    assert key is not None
    return field(SPAN_ATTRIBUTE, key_value(key, value))


def _of(name: str) -> str | None:
    return BY_NAME[name].attribute


def root_span(record: RequestRecord, span_id: bytes, operation: str = "chat") -> bytes:
    """The root span our instrumentation emits for this request (a ``Span`` message body)."""
    parts = [w.SPAN_TRACE_ID, bytes.fromhex(record.trace_id), w.SPAN_SPAN_ID, span_id,
             w.span_head(f"{operation} {record.model}", w.KIND_SERVER), w.span_times(record.start_ns, record.end_ns),
             _attr(A.GEN_AI_PROVIDER_NAME, record.engine), _attr(_of("engine"), record.engine),
             _attr(_of("track"), record.track), _attr(A.GEN_AI_OPERATION_NAME, operation),
             _attr(_of("model"), record.model), _attr(_of("tokens_in"), record.tokens_in),
             _attr(_of("tokens_out"), record.tokens_out)]
    if record.model_version:
        parts.append(_attr(_of("model_version"), record.model_version))
    for name, key in DOUBLE_ATTRIBUTES.items():
        value = getattr(record, name)
        if value is not None:
            parts.append(_attr(key, float(value)))
    if record.itl_count:
        parts.append(_attr(_of("itl_count"), record.itl_count))
    if record.tokens_cached:
        parts.append(_attr(_of("tokens_cached"), record.tokens_cached))
    if record.finish_reason is not None:
        parts.append(_attr(_of("finish_reason"), (record.finish_reason,)))
    if record.error_type is not None:
        parts += (_attr(_of("error_type"), record.error_type), field(w.SPAN_STATUS, w.STATUS_CODE_ERROR))
    return b"".join(parts)


def encode_requests(records: Iterable[RequestRecord], resource: dict[str, str] | None = None) -> bytes:
    """One ``ExportTraceServiceRequest`` holding the root spans of ``records`` (region from the records
    unless ``resource`` sets ``cloud.region``, as a gateway would), as wire bytes."""
    by_region: dict[str, list[bytes]] = {}
    for i, record in enumerate(records):
        region = (resource or {}).get(A.CLOUD_REGION, record.region)
        span_id = bytes.fromhex(record.span_id) if record.span_id else (i + 1).to_bytes(8, "big")
        by_region.setdefault(region, []).append(field(w.SCOPE_SPANS_SPAN, root_span(record, span_id)))
    out = []
    for region, spans in by_region.items():
        body = (field(w.RESOURCE_SPANS_RESOURCE, w.resource({**(resource or {}), A.CLOUD_REGION: region}))
                + field(w.RESOURCE_SPANS_SCOPE_SPANS, _SCOPE + b"".join(spans)))
        out.append(field(w.REQUEST_RESOURCE_SPANS, body))
    return b"".join(out)
