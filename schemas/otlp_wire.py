"""The OTLP protobuf wire format, written directly: the primitives every hand-written OTLP encoder shares.

Building protobuf message objects in Python costs ~10 µs per span and the SDK's encoder ~50 µs for a root
span with 22 attributes, more than a request may spend on telemetry; writing the bytes directly, with the
constant parts (keys, resource, scope, a pod's fixed attributes) encoded once, is several times cheaper.
Users: the instrumentation's span exporter (``instrumentation.otlp_encoder``, from SDK spans), the fleet
simulator (``simulator.encode``, from pre-built templates) and test helpers. Each user's tests decode the
bytes with the real ``opentelemetry-proto`` classes.

Field tags are named after the message and field they encode (``SPAN_ATTRIBUTE`` is ``Span.attributes``,
field 9, length-delimited); ``field(tag, payload)`` writes one length-delimited field.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

pack_double = struct.Struct("<d").pack
pack_fixed64 = struct.Struct("<Q").pack
pack_fixed32 = struct.Struct("<I").pack
_SPAN_TIMES = struct.Struct("<BQBQ").pack
INT64_MASK = (1 << 64) - 1

# --- field tags (field number << 3 | wire type), by message ---
# ExportTraceServiceRequest / ResourceSpans / ScopeSpans
REQUEST_RESOURCE_SPANS = b"\x0a"
RESOURCE_SPANS_RESOURCE, RESOURCE_SPANS_SCOPE_SPANS, RESOURCE_SPANS_SCHEMA_URL = b"\x0a", b"\x12", b"\x1a"
SCOPE_SPANS_SCOPE, SCOPE_SPANS_SPAN, SCOPE_SPANS_SCHEMA_URL = b"\x0a", b"\x12", b"\x1a"
# Resource / InstrumentationScope
RESOURCE_ATTRIBUTE = b"\x0a"
SCOPE_NAME, SCOPE_VERSION, SCOPE_ATTRIBUTE = b"\x0a", b"\x12", b"\x1a"
# Span (ids with their fixed lengths: trace id 16 bytes, span ids 8)
SPAN_TRACE_ID, SPAN_SPAN_ID, SPAN_TRACE_STATE, SPAN_PARENT_SPAN_ID = b"\x0a\x10", b"\x12\x08", b"\x1a", b"\x22\x08"
SPAN_NAME, SPAN_KIND = b"\x2a", b"\x30"  # kind: a varint (OTLP's enum: INTERNAL 1, SERVER 2, ...)
SPAN_ATTRIBUTE, SPAN_DROPPED_ATTRIBUTES, SPAN_EVENT, SPAN_DROPPED_EVENTS = b"\x4a", b"\x50", b"\x5a", b"\x60"
SPAN_LINK, SPAN_DROPPED_LINKS, SPAN_STATUS, SPAN_FLAGS = b"\x6a", b"\x70", b"\x7a", b"\x85\x01"  # flags: fixed32
KIND_INTERNAL, KIND_SERVER = b"\x30\x01", b"\x30\x02"  # SPAN_KIND with its value
# Span.Event / Span.Link / Status
EVENT_TIME, EVENT_NAME, EVENT_ATTRIBUTE, EVENT_DROPPED_ATTRIBUTES = b"\x09", b"\x12", b"\x1a", b"\x20"
LINK_TRACE_ID, LINK_SPAN_ID, LINK_ATTRIBUTE, LINK_DROPPED_ATTRIBUTES = b"\x0a\x10", b"\x12\x08", b"\x22", b"\x28"
LINK_FLAGS = b"\x35"  # fixed32
STATUS_MESSAGE, STATUS_CODE = b"\x12", b"\x18"
STATUS_CODE_ERROR = b"\x18\x02"
# KeyValue / AnyValue / ArrayValue, KeyValueList
KEY_VALUE_KEY, KEY_VALUE_VALUE = b"\x0a", b"\x12"
ANY_STRING, ANY_BOOL, ANY_INT, ANY_DOUBLE, ANY_ARRAY, ANY_KVLIST, ANY_BYTES = (
    b"\x0a", b"\x10", b"\x18", b"\x21", b"\x2a", b"\x32", b"\x3a")
LIST_VALUE = b"\x0a"  # ArrayValue.values, KeyValueList.values


def varint_loop(n: int) -> bytes:
    """A protobuf varint of a non-negative int."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


SMALL_LIMIT = 1 << 14
SMALL_VARINTS = tuple(varint_loop(i) for i in range(SMALL_LIMIT))  # every one- and two-byte varint: a lookup


def varint(n: int) -> bytes:
    """A protobuf varint of a non-negative int (lengths, counts: from the lookup table)."""
    return SMALL_VARINTS[n] if n < SMALL_LIMIT else varint_loop(n)


def field(tag: bytes, payload: bytes | bytearray) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (SMALL_VARINTS[n] if n < SMALL_LIMIT else varint_loop(n)) + payload


def span_times(start_ns: int, end_ns: int) -> bytes:
    """Span fields 7 and 8 (start and end, fixed64) with their tags."""
    return _SPAN_TIMES(0x39, start_ns, 0x41, end_ns)


def int64(value: int) -> bytes:
    """An int64 varint (two's complement for negatives), as protobuf writes it."""
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"{value} is out of the int64 range")
    return varint(value & INT64_MASK)


def any_value(value: Any) -> bytes:
    """An AnyValue message body, as the OpenTelemetry SDK's encoder maps Python values (exact types first)."""
    kind = type(value)
    if kind is str:
        raw = value.encode()
        return ANY_STRING + varint(len(raw)) + raw
    if kind is float:
        return ANY_DOUBLE + pack_double(value)
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        return ANY_INT + int64(value)
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return any_value(str(value))
    if isinstance(value, int):
        return ANY_INT + int64(int(value))
    if isinstance(value, float):
        return ANY_DOUBLE + pack_double(value)
    if isinstance(value, bytes):
        return field(ANY_BYTES, value)
    if isinstance(value, Sequence):
        return field(ANY_ARRAY, b"".join(field(LIST_VALUE, any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return field(ANY_KVLIST, b"".join(field(LIST_VALUE, key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def key_value(key: str, value: Any) -> bytes:
    """A KeyValue message body (the caller adds the parent's ``attributes`` tag: ``field(tag, ...)``)."""
    return field(KEY_VALUE_KEY, key.encode()) + field(KEY_VALUE_VALUE, any_value(value))


class KeyValueCache:
    """``key_value`` with bounded caches of encoded keys and of (key, string value) pairs (model names,
    tracks, stages recur on every span). Each cache is emptied when full, so unique values (response ids)
    cannot crowd the recurring ones out for good. ``key_value`` is a plain function (a closure: cheaper to
    call than a method); ``keys`` and ``pairs`` are the caches."""

    __slots__ = ("key_value", "keys", "limit", "pairs")

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        keys: dict[str, bytes] = {}
        pairs: dict[tuple[str, str], bytes] = {}
        self.keys, self.pairs = keys, pairs

        def cached_key_value(key: str, value: Any) -> bytes:
            if type(value) is str:
                pair = pairs.get((key, value))
                if pair is not None:
                    return pair
            encoded_key = keys.get(key)
            if encoded_key is None:
                raw = key.encode()
                encoded_key = KEY_VALUE_KEY + varint(len(raw)) + raw
                if len(keys) >= limit:
                    keys.clear()
                keys[key] = encoded_key
            body = encoded_key + field(KEY_VALUE_VALUE, any_value(value))
            if type(value) is str:
                if len(pairs) >= limit:
                    pairs.clear()
                pairs[(key, value)] = body
            return body

        self.key_value: Callable[[str, Any], bytes] = cached_key_value


def resource(attributes: Mapping[str, Any]) -> bytes:
    """A Resource message body with these attributes."""
    return b"".join(field(RESOURCE_ATTRIBUTE, key_value(k, v)) for k, v in attributes.items())


def scope(name: str | None, version: str | None, attributes: bytes = b"") -> bytes:
    """An InstrumentationScope message body (``attributes``: its encoded ``SCOPE_ATTRIBUTE`` fields)."""
    out = field(SCOPE_NAME, name.encode()) if name else b""
    if version:
        out += field(SCOPE_VERSION, version.encode())
    return out + attributes


def span_head(name: str, kind: bytes) -> bytes:
    """A span's name and kind fields (``kind``: ``KIND_SERVER``, ``KIND_INTERNAL``), for span templates."""
    return field(SPAN_NAME, name.encode()) + kind


def error_status(description: str) -> bytes:
    """The Status field of a failed span: code ERROR with its description."""
    return field(SPAN_STATUS, field(STATUS_MESSAGE, description.encode()) + STATUS_CODE_ERROR)


class IntAttr:
    """An int attribute with a fixed key, as a repeated ``attributes`` field (``tag``) of its parent:
    constant bytes + the value's varint. Non-negative values (counts)."""

    __slots__ = ("key", "tag")

    def __init__(self, tag: bytes, key: str) -> None:
        self.tag, self.key = tag, field(KEY_VALUE_KEY, key.encode())

    def __call__(self, value: int) -> bytes:
        v = ANY_INT + (SMALL_VARINTS[value] if value < SMALL_LIMIT else varint_loop(value))
        body = self.key + b"\x12" + SMALL_VARINTS[len(v)] + v  # KEY_VALUE_VALUE, length, AnyValue
        return self.tag + SMALL_VARINTS[len(body)] + body


class DoubleAttr:
    """A double attribute with a fixed key, as a repeated ``attributes`` field (``tag``) of its parent:
    ``prefix`` (constant) + the 8 bytes of the value, so a run of them packs in one ``struct`` call."""

    __slots__ = ("prefix",)

    def __init__(self, tag: bytes, key: str) -> None:
        encoded_key = field(KEY_VALUE_KEY, key.encode())
        body_len = len(encoded_key) + 11  # KEY_VALUE_VALUE, length 9, ANY_DOUBLE + 8 bytes
        self.prefix = tag + varint(body_len) + encoded_key + b"\x12\x09" + ANY_DOUBLE

    def __call__(self, value: float) -> bytes:
        return self.prefix + pack_double(value)
