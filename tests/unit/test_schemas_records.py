"""The per-request record and its validation."""

from __future__ import annotations

import pytest

from infersight.schemas.records import RECORD_FIELDS, RequestRecord, unique_requests, validate


def good(**overrides) -> RequestRecord:
    base = dict(trace_id="0af7651916cd43dd8448eb211c80319c", region="eu-west-1", model="llama",
                start_ns=1_000_000_000, end_ns=1_500_000_000, e2e_s=0.5, model_version="v3", track="canary",
                engine="vllm", ttft_s=0.05, queue_s=0.01, prefill_s=0.04, decode_s=0.45, itl_count=9,
                itl_mean_s=0.05, itl_p50_s=0.04, itl_p90_s=0.06, itl_p99_s=0.08, itl_max_s=0.09,
                tokens_in=100, tokens_out=10, tokens_cached=64, finish_reason="stop")
    base.update(overrides)
    return RequestRecord(**base)


def test_valid_record_has_no_violations():
    assert validate(good()) == []
    assert validate(good().to_dict()) == []


def test_round_trip_through_dict():
    record = good()
    assert RequestRecord.from_dict({**record.to_dict(), "ignored": 1}) == record
    assert set(record.to_dict()) == set(RECORD_FIELDS)


@pytest.mark.parametrize(("overrides", "field"), [
    ({"trace_id": "XYZ"}, "trace_id"),
    ({"trace_id": "0" * 32}, "trace_id"),
    ({"span_id": "b7ad6b71"}, "span_id"),
    ({"span_id": "0" * 16}, "span_id"),
    ({"span_id": None}, "span_id"),
    ({"region": ""}, "region"),
    ({"model": 3}, "model"),
    ({"track": "blue"}, "track"),
    ({"start_ns": -5}, "start_ns"),
    ({"end_ns": 999}, "end_ns"),
    ({"ttft_s": -0.1}, "ttft_s"),
    ({"queue_s": "fast"}, "queue_s"),
    ({"tokens_in": -1}, "tokens_in"),
    ({"tokens_out": 2.5}, "tokens_out"),
    ({"tokens_cached": 101}, "tokens_cached"),
    ({"ttft_s": 0.9}, "ttft_s"),
    ({"e2e_s": 2.0}, "e2e_s"),
    ({"itl_p90_s": 0.01}, "itl_p50_s"),
    ({"itl_mean_s": None}, "itl_mean_s"),
    ({"finish_reason": "bored"}, "finish_reason"),
    ({"finish_reason": None}, "finish_reason"),
    ({"ttft_s": None}, "ttft_s"),
    ({"ttft_s": float("nan")}, "ttft_s"),
])
def test_each_violation_names_its_field(overrides, field):
    problems = validate(good(**overrides))
    assert problems, overrides
    assert any(p.startswith(f"{field}:") for p in problems), problems


def test_error_without_finish_reason_is_valid():
    assert validate(good(finish_reason=None, error_type="TimeoutError")) == []


def test_garbage_is_reported_not_raised():
    problems = validate({"trace_id": None, "start_ns": "x", "bogus": object()})
    fields = {p.split(":")[0] for p in problems}
    assert {"trace_id", "region", "model", "e2e_s", "start_ns", "bogus"} <= fields


def test_unique_requests_keeps_the_first_copy_of_each_trace_and_span():
    a, b = good(span_id="b7ad6b7169203331").to_dict(), good(span_id="00f067aa0ba902b7").to_dict()
    legacy = good().to_dict()  # no span id: never treated as a copy
    out = list(unique_requests([a, dict(a), b, legacy, dict(legacy), dict(b)]))
    assert out == [a, b, legacy, legacy]  # same trace, another span: another request of that trace
