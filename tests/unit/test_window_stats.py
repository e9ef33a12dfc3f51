"""Window statistics against an independent offline computation (numpy) over the same records."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.flink_jobs.common import keys, windows
from infersight.flink_jobs.metrics import core
from infersight.flink_jobs.metrics.window_stats import (
    Cumulative,
    WindowStats,
    distribution_values,
    fact_of,
    window_of,
    window_of_facts,
)
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P
from tests.support.sample_requests import REGIONS, sample_records

START = 1_790_000_000 * 10**9


def records(n=30_000, slow_region="ap-southeast-1"):
    return [r.to_dict() for r in sample_records(n, START, 10.0, seed=11, slow_region=slow_region)]


def exact_quantile(values, q):
    """The exact quantile under DDSketch's rank definition: the value at rank floor(q * (n - 1))."""
    return float(np.quantile(np.asarray(values), q, method="lower"))


def offline_buckets(values, bounds):
    """Independent: numpy's searchsorted with side='left' is OTLP's (lower, upper] bucket rule."""
    return np.bincount(np.searchsorted(np.asarray(bounds), np.asarray(values), side="left"),
                       minlength=len(bounds) + 1).tolist()


def test_counts_buckets_exact_and_sketch_quantiles_within_one_percent():
    recs = records()
    stats = WindowStats()
    for r in recs:
        stats.add(r)
    assert stats.requests == len(recs)
    assert stats.error_count == sum(r["error_type"] is not None for r in recs)
    assert stats.tokens["output"] == sum(r["tokens_out"] for r in recs)
    for field, (_name, bounds) in P.DISTRIBUTIONS.items():
        values = [distribution_values(r)[field] for r in recs if field in distribution_values(r)]
        dist = stats.dists[field]
        assert dist.counts == offline_buckets(values, bounds), field
        assert dist.n == len(values) and dist.total == pytest.approx(sum(values))
        for q in P.QUANTILES:
            assert dist.quantile(q) == pytest.approx(exact_quantile(values, q), rel=0.01), (field, q)


def test_global_p99_from_merged_regional_sketches_is_right_and_averaging_regional_p99s_is_not():
    recs = records()
    regional = {region: WindowStats() for region in REGIONS}
    for r in recs:
        regional[r["region"]].add(r)
    merged = WindowStats()
    for stats in regional.values():
        merged.merge(stats)
    ttfts = [r["ttft_s"] for r in recs if r["error_type"] is None]
    exact_p99 = exact_quantile(ttfts, 0.99)
    assert merged.dists["ttft_s"].quantile(0.99) == pytest.approx(exact_p99, rel=0.01)
    averaged = float(np.mean([s.dists["ttft_s"].quantile(0.99) for s in regional.values()]))
    assert abs(averaged - exact_p99) / exact_p99 > 0.10, (averaged, exact_p99)  # wrong by far more than 1 %
    # bucket counts merge exactly
    assert merged.dists["ttft_s"].counts == offline_buckets(ttfts, M.TTFT_BUCKETS)


def test_encoded_window_carries_cumulative_counters_histograms_and_quantiles():
    recs = records(2_000, slow_region=None)
    first, second = WindowStats(), WindowStats()
    for i, r in enumerate(recs):
        (first if i < 1_000 else second).add(r)
    key = keys.series_key(recs[0])
    totals = Cumulative(START)
    totals.add_window(first)
    totals.add_window(second)
    req = ExportMetricsServiceRequest.FromString(core.encode_window(key, START + 20 * 10**9, second, totals))
    metrics = {m.name: m for m in req.resource_metrics[0].scope_metrics[0].metrics if m.HasField("sum")
               or m.HasField("gauge") or m.HasField("histogram")}
    [requests] = metrics[P.REQUESTS].sum.data_points
    assert requests.as_double == 2_000 and metrics[P.REQUESTS].sum.is_monotonic
    [window] = metrics[P.WINDOW_REQUESTS].gauge.data_points
    assert window.as_double == 1_000
    [hist] = metrics[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN].histogram.data_points
    assert list(hist.bucket_counts) == [a + b for a, b in zip(first.dists["ttft_s"].counts,
                                                              second.dists["ttft_s"].counts, strict=True)]
    assert {kv.key: kv.value.string_value for kv in hist.attributes} == keys.labels_of(key)
    # the same totals as exponential buckets (a native histogram in Prometheus), beside the explicit ones
    [native] = [p for m in req.resource_metrics[0].scope_metrics[0].metrics if m.HasField("exponential_histogram")
                and m.name == M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN for p in m.exponential_histogram.data_points]
    assert native.scale == P.EXPONENTIAL_SCALE and native.count == hist.count and native.sum == hist.sum
    ttfts = [r["ttft_s"] for r in recs if r.get("error_type") is None and r.get("ttft_s") is not None]
    base = 2 ** (2 ** -P.EXPONENTIAL_SCALE)
    expected = Counter(math.ceil(math.log(v, base)) - 1 for v in ttfts)  # bucket i: (base**i, base**(i+1)]
    got = {native.positive.offset + i: n for i, n in enumerate(native.positive.bucket_counts) if n}
    assert got == dict(expected) and native.zero_count == 0
    assert {kv.key: kv.value.string_value for kv in native.attributes} == keys.labels_of(key)
    quantiles = metrics[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN + P.WINDOW_QUANTILE_SUFFIX].gauge.data_points
    assert sorted(kv.value.string_value for p in quantiles for kv in p.attributes if kv.key == "quantile") == \
        ["0.5", "0.9", "0.99"]


def test_encoded_totals_carry_the_counters_and_histograms_of_the_window_batch_and_nothing_per_window():
    """How late records of a series that stopped reach Prometheus: the same cumulative points a window batch
    carries, at the given time, and no per-window gauge (those late records have no window)."""
    recs = records(500, slow_region=None)
    stats = WindowStats()
    for r in recs:
        stats.add(r)
    key = keys.series_key(recs[0])
    totals = Cumulative(START).add_window(stats)
    at = START + 10**9 + 1_000_000

    def points(payload: bytes) -> dict:
        req = ExportMetricsServiceRequest.FromString(payload)
        return {(m.name, m.WhichOneof("data")): m for m in req.resource_metrics[0].scope_metrics[0].metrics}

    alone = points(core.encode_totals(key, at, totals))
    window = points(core.encode_window(key, at, stats, totals))
    cumulative = ("sum", "histogram", "exponential_histogram")
    assert set(alone) == {key for key, m in window.items() if m.WhichOneof("data") in cumulative}
    assert (M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, "exponential_histogram") in alone
    assert (P.WINDOW_REQUESTS, "gauge") not in alone and (P.REQUESTS, "sum") in alone
    for name, metric in alone.items():
        assert metric == window[name], name
        kind = metric.WhichOneof("data")
        assert all(p.time_unix_nano == at for p in getattr(metric, kind).data_points)


def test_pod_gauges_roll_up_per_their_meaning_and_cost_follows_the_pricing():
    pods = core.PodWindow.empty()
    for pod, depth, kv, util in (("a", 3, 0.5, 0.9), ("b", 5, 0.7, 0.5)):
        for metric, value in ((M.QUEUE_DEPTH, depth), (M.KV_CACHE_USAGE, kv), (M.HW_GPU_UTILIZATION, util)):
            pods.add({"region": "us-east-1", "pod": pod, "metric": metric, "value": float(value),
                      "time_ns": START, "gpu_type": "H100", "gpu_count": 2})
    pods.add({"region": "us-east-1", "pod": "a", "metric": M.QUEUE_DEPTH, "value": 1.0, "time_ns": START + 1,
              "gpu_type": "H100", "gpu_count": 2})  # the later value of a gauge wins
    stats = pods.stats()
    assert stats[M.QUEUE_DEPTH] == {"sum": 6.0, "max": 5.0}
    assert stats[M.KV_CACHE_USAGE] == {"mean": pytest.approx(0.6), "max": 0.7}
    pricing = core.Pricing({"default": 1.0, "regions": {"us-east-1": {"H100": 3.6}}})
    gpu_s, cost, idle = pods.cost(10.0, pricing)
    assert gpu_s == 40.0 and cost == pytest.approx(40 * 3.6 / 3600)
    assert idle == pytest.approx(cost * (1 - 0.7))  # each pod's cost x its idle share (equal pods: the mean's)
    assert core.Pricing.load(None).usd_per_gpu_hour("nowhere", "X") > 0  # packaged file's default


def gauge(region: str, model: str, track: str, pod: str, metric: str, value: float, gpus: int = 1) -> dict:
    return {"region": region, "model": model, "model_version": "v1", "track": track, "pod": pod, "metric": metric,
            "value": value, "time_ns": START + 1, "gpu_type": "H100", "gpu_count": gpus, "engine": "vllm"}


def test_pod_gauges_and_cost_roll_up_per_deployment_region_and_everywhere():
    from infersight.schemas.prometheus import prometheus_name

    points = [gauge("us-east-1", "llama", "stable", "p1", M.QUEUE_DEPTH, 2.0),
              gauge("us-east-1", "llama", "canary", "p2", M.QUEUE_DEPTH, 3.0),
              gauge("eu-west-1", "llama", "stable", "p1", M.QUEUE_DEPTH, 5.0),  # same pod name, other region
              gauge("eu-west-1", "llama", "stable", "p1/0", M.HW_GPU_UTILIZATION, 0.25, gpus=2),
              gauge("eu-west-1", "llama", "stable", "p1/1", M.HW_GPU_UTILIZATION, 0.75, gpus=2)]
    groups, late = core.group_gauges(points, 10_000, watermark_ms=0)
    assert late == 0
    by_labels = {tuple(keys.deployment_labels(key).values()): core.PodWindow.of(group)
                 for (key, _end), group in groups.items()}
    assert set(by_labels) == {
        ("us-east-1", "llama", "v1", "stable"), ("us-east-1", "llama", "v1", "canary"),
        ("eu-west-1", "llama", "v1", "stable"),
        ("us-east-1", "all", "all", "all"), ("eu-west-1", "all", "all", "all"),  # each region, every deployment
        ("global", "llama", "v1", "stable"), ("global", "llama", "v1", "canary"),  # each deployment, everywhere
        ("global", "all", "all", "all")}
    depth = {labels: w.stats()[M.QUEUE_DEPTH]["sum"] for labels, w in by_labels.items()}
    assert depth[("us-east-1", "all", "all", "all")] == 5.0
    assert depth[("global", "llama", "v1", "stable")] == 7.0  # pods are told apart by region
    assert depth[("global", "all", "all", "all")] == 10.0
    # cost at every level: each pod at its own region's price; idle from each pod's own utilisation
    pricing = core.Pricing({"default": 1.0, "regions": {"eu-west-1": {"H100": 3.6}, "us-east-1": {"H100": 7.2}}})
    gpu_s, cost, idle = by_labels[("global", "all", "all", "all")].cost(10.0, pricing)
    assert gpu_s == 40.0  # 1 + 1 GPUs in us-east-1, 2 in eu-west-1, 10 s
    assert cost == pytest.approx((2 * 10 * 7.2 + 2 * 10 * 3.6) / 3600)
    assert idle == pytest.approx(2 * 10 * 3.6 / 3600 * 0.5)  # only the eu pod reports utilisation (mean 0.5)
    # what Prometheus gets: one name per gauge (no doubled prefix), deployment labels and the stat
    key, end = next((k, e) for (k, e) in groups if keys.deployment_labels(k)[P.LABEL_MODEL] == P.ALL_DEPLOYMENTS
                    and keys.deployment_labels(k)[P.LABEL_REGION] == "eu-west-1")
    window = core.merged_pod_windows([core.PodWindow.of(groups[key, end][:2]), core.PodWindow.of(groups[key, end][2:])])
    assert window.stats() == core.PodWindow.of(groups[key, end]).stats()  # partial windows merge to the whole
    totals = {"gpu_seconds": 20.0, "cost_usd": 0.02, "idle_usd": 0.01}
    req = ExportMetricsServiceRequest.FromString(core.encode_pods(key, end * 10**6, window, totals, 0))
    metrics = {m.name: m for m in req.resource_metrics[0].scope_metrics[0].metrics}
    assert set(metrics) == {P.POD_GAUGES[M.QUEUE_DEPTH].name, P.POD_GAUGES[M.HW_GPU_UTILIZATION].name,
                            P.GPU_SECONDS, P.COST_USD, P.IDLE_COST_USD}
    util = metrics[P.POD_GAUGES[M.HW_GPU_UTILIZATION].name]
    assert prometheus_name(util.name, util.unit, "gauge") == "infersight_pods_gpu_utilization_ratio"
    assert {kv.key: kv.value.string_value for kv in util.gauge.data_points[0].attributes} == {
        "region": "eu-west-1", "model": "all", "model_version": "all", "track": "all", "stat": "mean"}
    assert all(o.prometheus.count("infersight") <= 1 for o in P.OUTPUTS)  # no name says it twice
    unit = core.encode_unit_cost(key, end * 10**6, 0.5, 1_000_000)
    point = ExportMetricsServiceRequest.FromString(unit).resource_metrics[0].scope_metrics[0].metrics[0]
    assert point.gauge.data_points[0].as_double == 0.5 and len(point.gauge.data_points[0].attributes) == 4


def test_a_regional_windows_output_tokens_count_for_its_deployment_and_every_roll_up():
    from infersight.flink_jobs.metrics import functions as F

    series = keys.series_key({"region": "us-east-1", "model": "llama", "model_version": "v1", "track": "canary",
                              "engine": "vllm"})
    stats = window_of(records(50))
    out = list(F.output_tokens((series, 20 * 10**9, stats)))
    assert [key for _kind, key, _n, _end in out] == list(keys.deployment_rollups(keys.deployment_of_series(series)))
    assert {tuple(keys.deployment_labels(k).values()) for _, k, _, _ in out} == {
        ("us-east-1", "llama", "v1", "canary"), ("us-east-1", "all", "all", "all"),
        ("global", "llama", "v1", "canary"), ("global", "all", "all", "all")}
    assert all(kind == "tokens" and n == stats.tokens["output"] and end == 20 * 10**9 for kind, _k, n, end in out)


def test_a_request_delivered_twice_counts_once_in_its_window():
    recs = records(2_000)
    once = window_of(recs)
    twice = window_of(recs + [dict(r) for r in recs[::3]])  # a gateway re-sent every third request
    assert twice.requests == once.requests == len(recs)
    assert twice.tokens == once.tokens
    for field, dist in twice.dists.items():
        assert dist.counts == once.dists[field].counts, field
    no_ids = [{**r, "span_id": ""} for r in recs[:10]]
    assert window_of(no_ids + no_ids).requests == 20  # without span ids nothing is a copy


def test_a_batch_groups_by_series_and_window_and_late_records_are_set_apart():
    from infersight.flink_jobs.metrics import core

    base = next(iter(sample_records(1, 1_000_000_000_000, 1.0))).to_dict()  # a valid record: group_batch checks

    def rec(region: str, end_ms: int, track: str = "stable") -> dict:
        return {**base, "region": region, "model": "m", "model_version": "v1", "track": track, "engine": "vllm",
                "start_ns": end_ms * 1_000_000 - int(base["e2e_s"] * 1e9) - 1, "end_ns": end_ms * 1_000_000}

    batch = [rec("a", 10_500), rec("a", 19_999), rec("a", 20_000), rec("b", 10_001), rec("a", 15_000, "canary"),
             rec("a", 9_999), rec("b", 5_000)]
    groups, late = core.group_batch(batch, 10_000, watermark_ms=9_999)
    key_a, key_b = keys.series_key(batch[0]), keys.series_key(batch[3])
    assert late == {key_a: [batch[5]], key_b: [batch[6]]}  # their window [0, 10 s) fires at watermark 9,999
    assert groups[(key_a, 20_000)] == [batch[0], batch[1]]
    assert groups[(key_a, 30_000)] == [batch[2]]
    assert groups[(key_b, 20_000)] == [batch[3]]
    assert groups[(keys.series_key(batch[4]), 20_000)] == [batch[4]]
    assert sum(map(len, groups.values())) + sum(map(len, late.values())) == len(batch)
    assert windows.window_end_ms(19_999, 10_000) == 20_000 and windows.window_end_ms(20_000, 10_000) == 30_000


def test_late_records_of_a_series_are_one_element_and_count_each_request_once():
    import json

    from infersight.flink_jobs.metrics import functions as F

    records = [r.to_dict() for r in sample_records(40, 1_000_000_000_000, 5.0, regions=REGIONS[:1])]
    _, late = core.group_batch(records + records[:3], 10_000, watermark_ms=10**12)  # all late; 3 re-sent copies
    assert sum(map(len, late.values())) == 43 and len(late) < 43
    for key, group in late.items():
        element = (key, None, group)
        (own_key, _, own, first_end), (glob_key, _, glob, _) = F.late_series(element)
        assert own_key == key and glob_key == keys.global_key(key)
        unique = {r["trace_id"] for r in group}
        assert own.requests == glob.requests == len(unique)  # copies counted once, as in a window
        assert first_end == min(r["end_ns"] for r in group)
        assert [json.loads(line) for line in F.late_json(element)] == group  # the late topic: every record
        assert F.late_region(element) == group[0]["region"]


def test_window_of_facts_equals_window_of_records_and_counts_a_repeated_request_once():
    recs = records(2_000)
    facts = [fact_of(r) for r in recs]
    facts += facts[:50]  # a gateway re-sent a batch: same trace and span ids
    from_facts, from_records = window_of_facts(facts), window_of(recs)
    assert from_facts.requests == from_records.requests == len(recs)
    assert from_facts.errors == from_records.errors and from_facts.tokens == from_records.tokens
    for field, dist in from_records.dists.items():
        other = from_facts.dists[field]
        assert (other.counts, other.n, other.total) == (dist.counts, dist.n, dist.total), field
        assert other.quantile(0.99) == dist.quantile(0.99), field
    no_ids = [fact_of({**r, "span_id": ""}) for r in recs[:10]] * 2  # older producers: all kept
    assert window_of_facts(no_ids).requests == 20


def test_exponential_buckets_hold_each_value_in_its_upper_inclusive_bucket_merge_exactly_and_count_zeros():
    from infersight.flink_jobs.metrics.window_stats import Distribution, exponential_index

    base = 2 ** (2 ** -P.EXPONENTIAL_SCALE)
    assert exponential_index(1.0) == -1 and exponential_index(2.0) == 2 ** P.EXPONENTIAL_SCALE - 1  # (b**i, b**(i+1)]
    assert exponential_index(1.0000001) == 0 and exponential_index(0.2) == math.ceil(math.log(0.2, base)) - 1
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.lognormal(-2.5, 1.0, 3_000), np.zeros(40)])
    a, b, both = (Distribution(M.TTFT_BUCKETS) for _ in range(3))
    for i, v in enumerate(values):
        (a if i % 2 else b).add(float(v))
        both.add(float(v))
    a.merge(b, sketch=False)
    assert a.exp == both.exp and a.zero == both.zero == 40 and a.n == both.n == len(values)
    offset, counts = a.exponential_buckets()
    assert sum(counts) + a.zero == len(values) and counts[0] > 0 and counts[-1] > 0
    for i, n in enumerate(counts):  # every value lies in its bucket's bounds
        lo, hi = base ** (offset + i), base ** (offset + i + 1)
        assert n == sum(1 for v in values if v > 0 and lo * (1 - 1e-12) < v <= hi * (1 + 1e-12)), offset + i
