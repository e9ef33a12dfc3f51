"""The normaliser's fast path (span attributes parsed as maps, records built as dicts, a cheap validity
check before ``validate``) gives exactly what the plain path gives: OTLP's own types, RequestRecord and
``validate``."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
from google.protobuf.unknown_fields import UnknownFieldSet
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from infersight.flink_jobs.normalize import span_records as S
from infersight.flink_jobs.normalize.core import normalize
from infersight.flink_jobs.normalize.otlp_spans import TracesView, any_value
from infersight.schemas import attributes as A
from infersight.schemas.records import RECORD_FIELDS, RequestRecord, surely_valid, validate
from infersight.schemas.topics import DLQ, OTLP_REQUESTS, REQUESTS
from tests.bad_telemetry import NOW, OK, make_payload, make_span
from tests.support.sample_requests import sample_records


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (field numbers < 16)."""
    size, length = len(payload), bytearray()
    while size >= 0x80:
        length.append(size & 0x7F | 0x80)
        size >>= 7
    return bytes([number << 3 | 2, *length, size]) + payload


def _with_raw_attribute(span: Span, key_value: bytes) -> bytes:
    """``span`` encoded with one more attribute whose KeyValue bytes are given as they are."""
    return span.SerializeToString() + _field(9, key_value)


def _attrs_both_ways(span_bytes: bytes) -> tuple[dict, dict, bool]:
    payload = _field(1, _field(2, _field(2, span_bytes)))
    [real] = ExportTraceServiceRequest.FromString(payload).resource_spans[0].scope_spans[0].spans
    [view] = TracesView.FromString(payload).resource_spans[0].scope_spans[0].spans
    return ({kv.key: any_value(kv.value) for kv in real.attributes},
            {k: any_value(v) for k, v in view.attributes.items()}, len(UnknownFieldSet(view)) > 0)


def test_map_typed_attributes_read_as_the_keyvalue_list_does():
    span = make_span(a="first", b=2, c=0.5)
    span.attributes.append(KeyValue(key="a", value=AnyValue(int_value=3)))  # a repeated key: the last counts
    span.attributes.append(KeyValue(key="empty"))  # no value at all
    span.attributes.append(KeyValue(key="list", value=AnyValue(array_value=ArrayValue(
        values=[AnyValue(string_value="x"), AnyValue(bool_value=True)]))))
    # ``value`` twice in one KeyValue: the two AnyValues merge (the later oneof member wins)
    twice = (_field(1, b"m") + _field(2, AnyValue(string_value="s").SerializeToString())
             + _field(2, AnyValue(double_value=1.5).SerializeToString()))
    real, view, diverted = _attrs_both_ways(_with_raw_attribute(span, twice))
    assert not diverted
    assert view == real == {"a": 3, "b": 2, "c": 0.5, "empty": None, "list": ["x", True], "m": 1.5}


def test_a_keyvalue_upb_keeps_out_of_the_map_is_noticed():
    """upb leaves a map entry with a field other than key and value (KeyValue's key_strindex) out of the
    map; the span then has an unknown field, which sends the reader to the KeyValue list."""
    span = make_span()
    extra = KeyValue(key=A.E2E, value=AnyValue(double_value=0.5), key_strindex=4).SerializeToString()
    real, view, diverted = _attrs_both_ways(_with_raw_attribute(span, extra))
    assert real[A.E2E] == 0.5 and A.E2E not in view and diverted


def _normalized(payload: bytes, now: int) -> list[tuple[str, object, int]]:
    out = []
    for topic, value, ms in normalize(OTLP_REQUESTS.name, 1, 42, payload, now):
        data = json.loads(value)
        if topic == DLQ.name:
            data.pop("seen_ns")
        out.append((topic, data, ms))
    return out


def test_a_span_whose_attributes_are_not_all_in_the_map_gives_the_same_record_and_dead_letter():
    now = time.time_ns()
    good, bad = make_span(**OK), make_span(**{**OK, A.ENGINE: "warp-drive"})
    plain = _normalized(make_payload(good, bad), now)
    assert [t for t, _, _ in plain] == [DLQ.name, REQUESTS.name]
    for span in (good, bad):  # the same attribute again, now with key_strindex: upb diverts it
        span.attributes.append(KeyValue(key=A.GEN_AI_REQUEST_MODEL, value=AnyValue(string_value="m"),
                                        key_strindex=1))
    diverted = _normalized(make_payload(good, bad), now)
    assert [(t, v if t == REQUESTS.name else v["problems"], ms) for t, v, ms in diverted] == \
           [(t, v if t == REQUESTS.name else v["problems"], ms) for t, v, ms in plain]


def test_undecodable_bytes_are_named_by_the_contract_type():
    [(topic, letter, _)] = _normalized(make_payload(make_span(**OK))[:-7], NOW)
    assert topic == DLQ.name
    assert "opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest" in letter["reason"], letter


def test_the_record_template_is_the_dataclass_in_field_order():
    required = {"trace_id": "ab" * 16, "region": "r", "model": "m", "start_ns": 1, "end_ns": 2, "e2e_s": 0.0}
    assert all(f.default_factory is dataclasses.MISSING for f in dataclasses.fields(RequestRecord))
    built = {**S._RECORD_TEMPLATE, **required}
    assert list(built) == list(RECORD_FIELDS) and built == RequestRecord(**required).to_dict()


_EDGES = {
    "trace_id": ["0" * 32, "ab" * 15, "ab" * 17],
    "span_id": ["", "0" * 16, "01" * 7],
    "model": ["", None],
    "track": ["nope", "canary"],
    "e2e_s": [None, -0.0, -1.0, float("nan"), float("inf"), 1e-9, 99.0, 1],
    **{name: [None, 0.0, -1e-9, float("nan"), float("inf"), 1e-7, 5.0, 3]
       for name in ("ttft_s", "queue_s", "prefill_s", "decode_s", "itl_mean_s", "itl_p50_s", "itl_p90_s",
                    "itl_p99_s", "itl_max_s")},
    **{name: [0, -1, 10**6, True, 1.0] for name in ("itl_count", "tokens_in", "tokens_out", "tokens_cached")},
    "finish_reason": [None, "weird", "length", ""],
    "error_type": [None, "", 3, "timeout"],
}


@pytest.mark.parametrize("seed", range(3))
def test_the_cheap_validity_check_never_passes_what_validate_rejects(seed):
    """``records.surely_valid`` (the decoder's fast path) may send a good record on to ``validate`` but never
    wave a bad one through. (Only fields it may find off: times and region are checked before it runs.)"""
    passed = 0
    for record in sample_records(40, NOW - 10**10, 5.0, seed=seed):
        base = record.to_dict()
        assert surely_valid(base) and validate(base) == []  # the common case takes the fast path
        for name, values in _EDGES.items():
            for value in values:
                for other in (None, "ttft_s", "itl_count", "itl_p90_s"):  # one or two fields off
                    r = {**base, name: value}
                    if other is not None and other != name:
                        r[other] = _EDGES[other][(seed + len(name)) % len(_EDGES[other])]
                    if surely_valid(r):
                        assert validate(r) == [], r
                        passed += 1
    assert passed > 0
