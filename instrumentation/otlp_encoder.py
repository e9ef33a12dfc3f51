"""OTLP span encoding from finished SDK spans straight to the protobuf wire format (the exporter:
``infersight.instrumentation.otlp``).

The SDK's encoder builds a protobuf object per span, attribute and value in Python: about 50 µs for a root
span with 22 attributes and 20 µs for a stage span, more than the request that made them cost us. Here the
wire format is written directly with the shared primitives of ``infersight.schemas.otlp_wire`` (keys and
repeated string attributes encoded once and cached), and the bytes are parsed back into the request
message in C (upb) for the gRPC stub, which needs a message. ``tests/unit/test_otlp_encoder.py`` checks the
result equals the SDK encoder's message for spans of every shape.

Grouping differs in one way: spans are grouped by resource and scope *object* (the SDK hashes each span's
resource through JSON to group equal ones); spans from one provider share both objects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from infersight.instrumentation.text import as_text
from infersight.schemas import otlp_wire as w
from infersight.schemas.otlp_wire import SMALL_VARINTS, field, pack_fixed32, span_times, varint

_log = logging.getLogger(__name__)

_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200  # SpanFlags: the SDK sets the first always, the second for remote parents
CACHE = w.KeyValueCache(4096)  # this process's encoded keys and string pairs (bounded; see KeyValueCache)
_key_value = CACHE.key_value


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Repeated KeyValue fields; an attribute that cannot be encoded is logged and left out, as the SDK does."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():
        try:
            parts.append(field(tag, _key_value(key, value)))
        except Exception as error:  # noqa: BLE001 - one bad attribute must not lose the span
            _log.exception("Failed to encode key %s: %s", key, error)
    return b"".join(parts)


def _utf8(text: Any) -> bytes:
    """A span's (or event's) name or status message as UTF-8. Our own requests' names are valid text already;
    another library's span on the same provider may not be: a lone surrogate becomes U+FFFD and a non-string
    its ``str`` (``text.as_text``), so one span never fails the export batch."""
    try:
        return text.encode()
    except Exception:  # noqa: BLE001 - UnicodeEncodeError, or AttributeError on a non-string
        return as_text(text).encode()


def _flags(context: Any) -> int:
    """Span.flags as the SDK's ``_span_flags`` sets them (from the parent's, or a link's, context)."""
    return _HAS_IS_REMOTE | _IS_REMOTE if context is not None and context.is_remote else _HAS_IS_REMOTE


def _span(span: Any) -> bytes:
    """A Span message body (fields as the SDK's ``_encode_span`` fills them)."""
    context = span.context
    out = bytearray(w.SPAN_TRACE_ID)
    out += context.trace_id.to_bytes(16, "big")
    out += w.SPAN_SPAN_ID
    out += context.span_id.to_bytes(8, "big")
    trace_state = context.trace_state
    if trace_state:
        out += field(w.SPAN_TRACE_STATE, ",".join(f"{k}={v}" for k, v in trace_state.items()).encode())
    parent = span.parent
    if parent:
        out += w.SPAN_PARENT_SPAN_ID
        out += parent.span_id.to_bytes(8, "big")
    name = span.name
    if name:
        out += field(w.SPAN_NAME, _utf8(name))
    out += w.SPAN_KIND + SMALL_VARINTS[span.kind.value + 1]  # the SDK's enum counts from 0, OTLP's from 1
    out += span_times(span.start_time, span.end_time)
    out += _attributes(w.SPAN_ATTRIBUTE, span.attributes)
    dropped = span.dropped_attributes
    if dropped:
        out += w.SPAN_DROPPED_ATTRIBUTES + varint(dropped)
    for event in span.events:
        body = w.EVENT_TIME + w.pack_fixed64(event.timestamp)
        if event.name:
            body += field(w.EVENT_NAME, _utf8(event.name))
        body += _attributes(w.EVENT_ATTRIBUTE, event.attributes)
        if event.dropped_attributes:
            body += w.EVENT_DROPPED_ATTRIBUTES + varint(event.dropped_attributes)
        out += field(w.SPAN_EVENT, body)
    if span.dropped_events:
        out += w.SPAN_DROPPED_EVENTS + varint(span.dropped_events)
    for link in span.links:
        body = (w.LINK_TRACE_ID + link.context.trace_id.to_bytes(16, "big") + w.LINK_SPAN_ID
                + link.context.span_id.to_bytes(8, "big") + _attributes(w.LINK_ATTRIBUTE, link.attributes))
        if link.dropped_attributes:
            body += w.LINK_DROPPED_ATTRIBUTES + varint(link.dropped_attributes)
        out += field(w.SPAN_LINK, body + w.LINK_FLAGS + pack_fixed32(_flags(link.context)))
    if span.dropped_links:
        out += w.SPAN_DROPPED_LINKS + varint(span.dropped_links)
    status = span.status
    if status is not None:
        body = field(w.STATUS_MESSAGE, _utf8(status.description)) if status.description else b""
        code = status.status_code.value
        out += field(w.SPAN_STATUS, body + (w.STATUS_CODE + varint(code) if code else b""))
    out += w.SPAN_FLAGS + pack_fixed32(_flags(parent))
    return bytes(out)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    return w.scope(scope.name, scope.version, _attributes(w.SCOPE_ATTRIBUTE, scope.attributes))


def encode_spans(spans: Sequence[Any]) -> bytes:
    """The ``ExportTraceServiceRequest`` for finished SDK spans, as wire bytes."""
    groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
    for span in spans:
        resource = span.resource
        group = groups.get(id(resource))
        if group is None:
            group = groups[id(resource)] = (resource, {})
        scope = span.instrumentation_scope or None
        scoped = group[1].get(id(scope))
        if scoped is None:
            scoped = group[1][id(scope)] = (scope, [])
        scoped[1].append(field(w.SCOPE_SPANS_SPAN, _span(span)))
    out = bytearray()
    for resource, scopes in groups.values():
        body = bytearray(field(w.RESOURCE_SPANS_RESOURCE, _attributes(w.RESOURCE_ATTRIBUTE, resource.attributes)))
        for scope, encoded in scopes.values():
            scope_body = field(w.SCOPE_SPANS_SCOPE, _scope(scope)) + b"".join(encoded)
            schema = scope.schema_url if scope is not None else None
            if schema:
                scope_body += field(w.SCOPE_SPANS_SCHEMA_URL, schema.encode())
            body += field(w.RESOURCE_SPANS_SCOPE_SPANS, scope_body)
        if resource.schema_url:
            body += field(w.RESOURCE_SPANS_SCHEMA_URL, resource.schema_url.encode())
        out += field(w.REQUEST_RESOURCE_SPANS, body)
    return bytes(out)
