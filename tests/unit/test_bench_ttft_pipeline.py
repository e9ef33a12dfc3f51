"""The TTFT benchmark's pipeline side, pure parts: client TTFT per joined call from ``infersight.client_calls``
records, exact quantiles, and reading Prometheus' answers."""

from __future__ import annotations

import json
import math

import pytest

from bench import ttft_pipeline as tp

T0 = 1_800_000_000_000_000_000


def half(side: str, trace: int, span: int, parent: int | None, model: str, ttft_s: float | None,
         region: str | None = "us-east-1", start_ns: int = T0, end_ns: int = T0 + 2_000_000_000) -> dict:
    return {"side": side, "trace_id": f"{trace:032x}", "span_id": f"{span:016x}",
            "parent_span_id": "" if parent is None else f"{parent:016x}", "model": model,
            "region": region, "start_ns": start_ns, "end_ns": end_ns, "ttft_s": ttft_s}


def message(*halves: dict) -> bytes:
    return json.dumps(list(halves)).encode()


def test_the_client_ttft_of_each_call_joined_by_parent_under_the_servers_region_and_model():
    model = "ttft-abc-c8"
    messages = [
        # trace 1: client half first, its server half in a later message
        message(half("client", 1, 0x11, None, model, 0.0421, region="eu-west-1")),
        message(half("server", 1, 0x12, 0x11, model, 0.0300, start_ns=T0 + 1_000_000),
                # trace 2: server half first; joined when its client comes
                half("server", 2, 0x22, 0x21, model, 0.0100, start_ns=T0 + 1_000_000)),
        message(half("client", 2, 0x21, None, model, 0.0555),
                # trace 3: another model's call (another pass): not this pass's
                half("client", 3, 0x31, None, "other", 0.9),
                half("server", 3, 0x32, 0x31, "other", 0.8, start_ns=T0 + 1_000_000),
                # trace 4: a client no server reported: not joined
                half("client", 4, 0x41, None, model, 0.7),
                # trace 5: a server half whose parent is not the client span: not joined by parent
                half("client", 5, 0x51, None, model, 0.6),
                half("server", 5, 0x52, 0x99, model, 0.5, start_ns=T0 + 1_000_000)),
        b"not json",  # the job dead-letters it; the rest counts
        message({"side": "client", "trace_id": "zz"}),
    ]
    got = tp.joined_client_ttfts(messages, model)
    assert got == {f"{1:032x}": (0.0421, 0.0300), f"{2:032x}": (0.0555, 0.0100)}
    assert tp.joined_client_ttfts(messages, model, region="us-east-1") == got
    assert tp.joined_client_ttfts(messages, model, region="eu-west-1") == {}  # the client's region is not used
    assert tp.joined_client_ttfts(messages, "other") == {f"{3:032x}": (0.9, 0.8)}
    assert tp.server_halves(messages, model) == 3


def test_a_half_that_breaks_the_contract_is_left_out_as_the_job_dead_letters_it():
    model = "m"
    too_long = half("client", 6, 0x61, None, model, 5.0)  # TTFT longer than its span
    messages = [message(too_long, half("server", 6, 0x62, 0x61, model, 0.1, start_ns=T0 + 1))]
    assert tp.joined_client_ttfts(messages, model) == {}


def test_exact_quantiles_linear_and_nearest_rank_in_ms():
    values = [0.001 * i for i in range(1, 101)]  # 1..100 ms
    assert tp.exact_ms(values, 0.5) == 50.5
    assert tp.exact_ms(values, 0.5, method="inverted_cdf") == 50.0
    assert tp.exact_ms(values, 0.99) == 99.01
    assert tp.exact_ms(values, 0.99, method="inverted_cdf") == 99.0
    assert tp.exact_ms([], 0.5) is None


def test_per_request_difference_and_relative_error():
    measured = {"a": 0.0400, "b": 0.0500, "only-measured": 1.0}
    pipeline = {"a": 0.0400, "b": 0.0503, "only-pipeline": 2.0}
    assert tp.max_abs_diff_ms(measured, pipeline) == pytest.approx(0.3)
    assert tp.max_abs_diff_ms(measured, {}) is None
    assert tp.relative_error(101.0, 100.0) == 0.01
    assert tp.relative_error(None, 100.0) is None and tp.relative_error(1.0, 0.0) is None


def vector(*values: str) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"region": "us-east-1", "n": str(i)}, "value": [1800000000.123, v]} for i, v in enumerate(values)]}}


def test_prometheus_answers_are_read_as_one_value_or_none():
    assert tp.instant_value(vector("0.0421")) == 0.0421
    assert tp.instant_value(vector()) is None
    assert math.isnan(tp.instant_value(vector("NaN")))
    assert math.isinf(tp.instant_value(vector("+Inf")))
    assert tp.instant_value({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}}) == 3.0
    with pytest.raises(ValueError, match="one series"):
        tp.instant_value(vector("1", "2"))
    with pytest.raises(ValueError, match="bad_data: parse error"):
        tp.instant_value({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(ValueError, match="matrix"):
        tp.instant_value({"status": "success", "data": {"resultType": "matrix", "result": []}})


def test_the_queries_name_one_series_of_the_client_ttft_native_histogram():
    assert tp.quantile_query(0.99, "us-east-1", "ttft-abc-c1") == (
        'histogram_quantile(0.99, infersight_client_time_to_first_token_seconds'
        '{region="us-east-1",model="ttft-abc-c1"})')
    assert tp.count_query("r", 'a"b\\') == (
        'infersight_client_time_to_first_token_seconds_count{region="r",model="a\\"b\\\\"}')
