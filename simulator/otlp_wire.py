"""Protobuf wire-format pieces for pre-encoded OTLP templates.

Hand-written on purpose: building protobuf message objects costs ~10 us per span, too much for 30K
requests/s on two cores; constant parts (resource, scope, a pod's fixed attributes) are encoded once
and each request adds only its own ids, times and numbers. ``tests/unit/test_simulator*.py`` decode
the output with the real ``opentelemetry-proto`` classes."""

from __future__ import annotations

import struct

from infersight.instrumentation.otlp_encoder import varint_loop as _varint

_DOUBLE = struct.Struct("<d").pack
_TWO_FIXED64 = struct.Struct("<BQBQ").pack  # span start (field 7) and end (field 8) with their tags


_SMALL = tuple(_varint(i) for i in range(1 << 16))  # token counts and lengths: a lookup, not a loop


def varint(n: int) -> bytes:
    return _SMALL[n] if n < 65536 else _varint(n)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def any_string(value: str) -> bytes:
    return field(1, value.encode())


def kv_string(key: str, value: str) -> bytes:
    """A ``KeyValue`` (as the repeated ``attributes`` entry ``tag`` of its parent is added by the caller)."""
    return field(1, key.encode()) + field(2, any_string(value))


def kv_bool(key: str, value: bool) -> bytes:
    return field(1, key.encode()) + field(2, b"\x10" + (b"\x01" if value else b"\x00"))


def kv_int(key: str, value: int) -> bytes:
    return field(1, key.encode()) + field(2, b"\x18" + varint(value))


def kv_string_array(key: str, values: tuple[str, ...]) -> bytes:
    array = b"".join(field(1, any_string(v)) for v in values)
    return field(1, key.encode()) + field(2, field(5, array))


class IntAttr:
    """``attributes`` entry (field ``number`` of the parent) of an int attribute: prefix + varint."""

    __slots__ = ("head",)

    def __init__(self, number: int, key: str) -> None:
        self.head = (number, field(1, key.encode()))

    def __call__(self, value: int) -> bytes:
        number, key = self.head
        v = b"\x18" + (_SMALL[value] if value < 65536 else _varint(value))
        body = key + b"\x12" + _SMALL[len(v)] + v
        return _SMALL[number << 3 | 2] + _SMALL[len(body)] + body


class DoubleAttr:
    """``attributes`` entry of a double attribute: a constant prefix + 8 bytes."""

    __slots__ = ("prefix",)

    def __init__(self, number: int, key: str) -> None:
        body_len = len(field(1, key.encode())) + 11  # 0x12 0x09 0x21 + 8 bytes
        self.prefix = varint(number << 3 | 2) + varint(body_len) + field(1, key.encode()) + b"\x12\x09\x21"

    def __call__(self, value: float) -> bytes:
        return self.prefix + _DOUBLE(value)


def times(start_ns: int, end_ns: int) -> bytes:
    """Span fields 7 and 8 (fixed64)."""
    return _TWO_FIXED64(0x39, start_ns, 0x41, end_ns)
