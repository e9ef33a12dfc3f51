"""OTLP -> Prometheus names as the sink collector's remote-write translation makes them."""

import pytest

from infersight.schemas import pipeline as P
from infersight.schemas.prometheus import prometheus_name


@pytest.mark.parametrize("name,unit,kind,expected", [
    ("gen_ai.server.time_to_first_token", "s", "histogram", "gen_ai_server_time_to_first_token_seconds"),
    ("gen_ai.server.time_to_first_token.quantile", "s", "gauge", "gen_ai_server_time_to_first_token_quantile_seconds"),
    ("infersight.requests", "{request}", "counter", "infersight_requests_total"),
    ("infersight.requests.total", "{request}", "counter", "infersight_requests_total"),  # never _total_total
    ("infersight.window.error.ratio", "1", "gauge", "infersight_window_error_ratio"),  # never _ratio_ratio
    ("infersight.server.kv_cache.usage", "1", "gauge", "infersight_server_kv_cache_usage_ratio"),
    ("infersight.server.kv_cache.usage", "1", "counter", "infersight_server_kv_cache_usage_total"),  # _ratio: gauges
    ("hw.gpu.memory.usage", "By", "gauge", "hw_gpu_memory_usage_bytes"),
    ("infersight.cost.gpu", "s", "counter", "infersight_cost_gpu_seconds_total"),
    ("infersight.cost.gpu.seconds", "s", "counter", "infersight_cost_gpu_seconds_total"),  # unit word once
    ("net.io", "By/s", "gauge", "net_io_bytes_per_second"),
    ("a..b__c", "", "gauge", "a_b_c"),
    ("9lives", "", "gauge", "_9lives"),
    ("vllm:num_requests_waiting", "", "gauge", "vllm:num_requests_waiting"),
])
def test_translation(name, unit, kind, expected):
    assert prometheus_name(name, unit, kind) == expected


def test_bad_kind_and_empty_name_are_named():
    with pytest.raises(ValueError, match="summary"):
        prometheus_name("x", "", "summary")
    with pytest.raises(ValueError, match="no character"):
        prometheus_name("...", "", "gauge")


def test_every_output_has_one_distinct_prometheus_name():
    names = [o.prometheus for o in P.OUTPUTS]
    assert len(names) == len(set(names))
    assert P.prom(P.REQUESTS) == "infersight_requests_total"
    with pytest.raises(KeyError, match="not a metric the metrics job writes"):
        P.prom("infersight.nope")
