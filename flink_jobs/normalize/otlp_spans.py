"""Pure decoding of OTLP span batches (the gateways' ``otlp_proto`` Kafka payload)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


def any_value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def _traces_view() -> type:
    """OTLP ``TracesData`` with ``Span.attributes`` re-declared as ``map<string, AnyValue>``.

    Same bytes on the wire: a map entry is a message with key = 1 and value = 2, exactly ``KeyValue``'s
    ``key`` and ``value``. Parsed this way a span's attributes are a C-level dict (keyed lookups, and an
    ``AnyValue`` wrapper only for the keys read) instead of a list of ``KeyValue`` messages that must all
    be wrapped to be searched (a quarter of the normaliser's cost). Repeated keys keep the last value,
    as a dict built from the list does. Everything else is OTLP's own schema, in a private pool.

    One difference: upb keeps a map entry holding a field other than key and value (``KeyValue``'s
    ``key_strindex``, an unknown field) out of the map, as an unknown field of the span; readers check a
    span's ``UnknownFieldSet`` and fall back to ``ExportTraceServiceRequest`` for such a span."""
    pool = descriptor_pool.DescriptorPool()
    for module in (common_pb2, resource_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    trace = descriptor_pb2.FileDescriptorProto.FromString(trace_pb2.DESCRIPTOR.serialized_pb)
    span = next(m for m in trace.message_type if m.name == "Span")
    entry = span.nested_type.add(name="AttributesEntry")
    entry.options.map_entry = True
    optional = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    entry.field.add(name="key", json_name="key", number=1, label=optional,
                    type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING)
    entry.field.add(name="value", json_name="value", number=2, label=optional,
                    type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                    type_name=".opentelemetry.proto.common.v1.AnyValue")
    attributes = next(f for f in span.field if f.name == "attributes")
    attributes.type_name = ".opentelemetry.proto.trace.v1.Span.AttributesEntry"
    pool.Add(trace)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("opentelemetry.proto.trace.v1.TracesData"))


# Parses an ExportTraceServiceRequest's bytes (its only field, resource_spans = 1, is TracesData's too).
TracesView = _traces_view()


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
