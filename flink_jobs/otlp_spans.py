"""Pure decoding of OTLP span batches (the gateways' ``otlp_proto`` Kafka payload)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def any_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def iter_spans(payload: bytes) -> Iterator[dict[str, Any]]:
    """One flat dict per span: ids as hex, times in ns, resource and span attributes.

    Raises ``google.protobuf.message.DecodeError`` on bytes that are not an OTLP trace request.
    """
    request = ExportTraceServiceRequest.FromString(payload)
    for resource_spans in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "start_time_unix_nano": span.start_time_unix_nano,
                    "end_time_unix_nano": span.end_time_unix_nano,
                    "resource": resource,
                    "attributes": {kv.key: any_value(kv.value) for kv in span.attributes},
                }
