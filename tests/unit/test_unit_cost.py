"""Unit cost ($ per 1M output tokens) joins a deployment's window cost (pods) with its output tokens (requests):
two sources, so either half may reach the join after the other source moved the watermark on (CI stop 30: a quiet
spell of requests beside pods that report every scrape left a Flink window without its tokens, and no unit cost
at all). ``UnitCostWindows`` driven by the fake keyed runtime; the real stack runs it in
``tests/integration/test_pod_rollups.py``."""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.flink_jobs.common import keys
from infersight.flink_jobs.metrics import functions as F
from infersight.schemas import pipeline as P
from infersight.schemas.units import MS
from tests.support.keyed_runtime import Runtime

W_MS = 10_000
END_MS = 1_790_000_010_000  # a window's end
SETTLE_MS = 5_000
KEY = keys.deployment_key({"region": "us-east-1", "model": "llama", "model_version": "v2", "track": "canary"})


def _join():
    return Runtime(F.UnitCostWindows(SETTLE_MS, 130.0), key_of=F.unit_cost_key)


def _cost(usd, end_ms=END_MS):
    return "cost", KEY, usd, end_ms * MS


def _tokens(n, end_ms=END_MS):
    return "tokens", KEY, float(n), end_ms * MS


def _points(out):
    """Results -> [(window end ns, $ per 1M output tokens, labels)]."""
    points = []
    for encoded in out:
        metric = ExportMetricsServiceRequest.FromString(encoded).resource_metrics[0].scope_metrics[0].metrics[0]
        assert metric.name == P.USD_PER_1M_OUTPUT_TOKENS
        point = metric.gauge.data_points[0]
        points.append((point.time_unix_nano, point.as_double,
                       {kv.key: kv.value.string_value for kv in point.attributes}))
    return points


def test_both_halves_on_time_answer_once_at_the_watermark_stamped_with_the_windows_end():
    join = _join()
    assert join.send(_cost(0.02)) == [] and join.send(_tokens(1_000)) == [] and join.send(_tokens(3_000)) == []
    assert join.advance(watermark=END_MS - 2) == []
    [(stamp, usd, labels)] = _points(join.advance(watermark=END_MS - 1))
    assert stamp == END_MS * MS and usd == 0.02 / 4_000 * 1e6
    assert labels == {"region": "us-east-1", "model": "llama", "model_version": "v2", "track": "canary"}
    assert join.advance(now=10**15) == []  # nothing else, ever


def test_tokens_behind_the_watermark_join_their_cost_once_their_burst_is_in_and_later_ones_are_counted():
    """The failure CI caught: requests idle, pods move the watermark past the window; the tokens come after."""
    join = _join()
    join.send(_cost(0.02))
    assert join.advance(watermark=END_MS + 5_000, now=1_000) == []  # fired with the cost only: no figure, no $0
    join.now = 2_000
    assert join.send(_tokens(1_000)) == []
    join.now = 4_000
    assert join.send(_tokens(3_000)) == []  # the same burst: the settle timer re-arms
    assert join.advance(now=2_000 + SETTLE_MS) == []
    [(stamp, usd, _)] = _points(join.advance(now=4_000 + SETTLE_MS))
    assert stamp == END_MS * MS and usd == 0.02 / 4_000 * 1e6
    assert join.send(_tokens(500)) == [] and join.advance(now=10**6) == []  # never a second value for one time
    assert join.counters["late_unit_cost_tokens"].n == 500


def test_a_cost_behind_the_watermark_joins_tokens_that_came_on_time():
    join = _join()
    join.send(_tokens(2_000))
    assert join.advance(watermark=END_MS + 5_000, now=1_000) == []
    join.send(_cost(0.01))
    [(_, usd, _)] = _points(join.advance(now=1_000 + SETTLE_MS))
    assert usd == 0.01 / 2_000 * 1e6


def test_a_window_without_requests_or_without_pods_never_answers_and_windows_stay_apart():
    join = _join()
    join.send(_cost(0.02))  # the stable track: pods, no requests
    join.send(_tokens(1_000, END_MS + W_MS))  # the next window: requests, no pods
    join.send(_cost(0.03, END_MS + 2 * W_MS))
    join.send(_tokens(6_000, END_MS + 2 * W_MS))
    out = _points(join.advance(watermark=END_MS + 3 * W_MS, now=10**6))
    assert [(stamp, usd) for stamp, usd, _ in out] == [((END_MS + 2 * W_MS) * MS, 0.03 / 6_000 * 1e6)]


def test_cost_and_tokens_of_one_deployment_and_window_meet_under_one_key():
    """The job's halves as its functions make them: ``CumulatePods``' cost and ``output_tokens``' tokens."""
    from infersight.flink_jobs.metrics import core
    from infersight.flink_jobs.metrics.window_stats import window_of
    from tests.support.sample_requests import sample_records

    series = keys.series_key({"region": "us-east-1", "model": "llama", "model_version": "v2", "track": "canary",
                              "engine": "vllm"})
    records = [r.to_dict() for r in sample_records(20, (END_MS - W_MS) * MS, 9.0, seed=3, regions=("us-east-1",),
                                                   models=("llama",))]
    tokens = list(F.output_tokens((series, END_MS * MS, window_of(records))))
    pods = core.PodWindow.of([{"metric": "infersight.server.queue.depth", "region": "us-east-1", "pod": "p1",
                               "time_ns": (END_MS - 5_000) * MS, "value": 1.0, "gpu_count": 2}])
    cumulate = Runtime(F.CumulatePods(W_MS * MS, core.Pricing({"default": 3.0}), 0.0), key_of=F.first)
    [cost] = [o for o in cumulate.send((KEY, END_MS * MS, pods)) if F.is_cost(o)]
    assert F.unit_cost_key(cost) == F.unit_cost_key(tokens[0]) == keys.timed_key(KEY, END_MS)
