"""Cardinality bounds in the jobs (issue #20 item 3): per label a bound on distinct values within a time span,
values past it folded into ``_OTHER`` and counted; well-behaved series stay exact however many one-off model
names flood in."""

from __future__ import annotations

from collections import Counter

from infersight.flink_jobs.common import keys
from infersight.flink_jobs.common.cardinality import GAUGE_LABELS, REQUEST_LABELS, LabelLimiter, limits_of
from infersight.flink_jobs.metrics import core
from infersight.schemas.pipeline import OVERFLOW_VALUE
from tests.support.sample_requests import sample_records

NOW_MS = 1_780_000_000_000
WINDOW_MS = 10_000


def test_many_distinct_model_names_leave_the_series_bounded_and_the_well_behaved_series_exact():
    good = [r.to_dict() for r in sample_records(600, NOW_MS * 1_000_000, 30.0, models=("llama", "qwen"))]
    flood = [{**r, "model": f"client-{i}", "trace_id": f"{i + 1:032x}"}
             for i, r in enumerate(r.to_dict() for r in sample_records(3000, NOW_MS * 1_000_000, 30.0, seed=9))]
    batch = [x for pair in zip(good * 5, flood, strict=False) for x in pair] + good[len(flood) // 5:]
    limiter = LabelLimiter(limits_of("model=20", REQUEST_LABELS), span_ms=3_600_000)
    groups, late = core.group_batch(batch, WINDOW_MS, -2**63, None, lambda r: limiter.fold(r, NOW_MS))
    assert not late
    models = {keys.labels_of(key)["model"] for key, _ in groups}
    assert len(models) <= 20 + 1 and OVERFLOW_VALUE in models and {"llama", "qwen"} <= models
    counted = Counter(keys.labels_of(key)["model"] for (key, _), records in groups.items() for _ in records)
    sent = Counter(r["model"] for r in batch if not r["model"].startswith("client-"))
    assert counted["llama"] == sent["llama"] and counted["qwen"] == sent["qwen"]
    assert sum(counted.values()) == len(batch)  # folded, never dropped
    assert limiter.folded["model"] == counted[OVERFLOW_VALUE] > 2900
    assert limiter.folded["region"] == limiter.folded["error_type"] == 0


def test_a_value_unseen_for_the_span_frees_its_place():
    limiter = LabelLimiter({"model": 2}, span_ms=60_000)
    assert limiter.fold({"model": "a"}, 0)["model"] == "a"
    assert limiter.fold({"model": "b"}, 1_000)["model"] == "b"
    assert limiter.fold({"model": "c"}, 2_000)["model"] == OVERFLOW_VALUE
    assert limiter.fold({"model": "b"}, 59_000)["model"] == "b"  # b keeps coming: it stays
    assert limiter.fold({"model": "c"}, 61_000)["model"] == "c"  # a was unseen for the span: c takes its place
    assert limiter.fold({"model": "a"}, 62_000)["model"] == OVERFLOW_VALUE
    assert limiter.folded == {"model": 2}
    record = {"model": "z", "region": "r"}
    assert limiter.fold(record, 62_500) is not record and record["model"] == "z"  # a copy: the input is kept


def test_pod_gauges_fold_their_deployment_labels_but_never_the_pod():
    assert "pod" not in GAUGE_LABELS
    limiter = LabelLimiter(limits_of("1", GAUGE_LABELS), fields=GAUGE_LABELS)
    gauges = [{"region": "r", "model": f"m{i}", "model_version": "", "track": "stable", "pod": f"p{i}",
               "metric": "infersight.server.queue.depth", "value": 1.0, "time_ns": NOW_MS * 1_000_000}
              for i in range(5)]
    groups, late = core.group_gauges(gauges, WINDOW_MS, -2**63, None, lambda g: limiter.fold(g, NOW_MS))
    deployments = {keys.deployment_labels(key)["model"] for key, _ in groups}
    assert deployments == {"m0", OVERFLOW_VALUE, "all"} and limiter.folded["model"] == 4
    assert {p["pod"] for points in groups.values() for p in points} == {f"p{i}" for i in range(5)}


def test_limits_of_reads_one_bound_or_per_label_bounds():
    assert limits_of("", REQUEST_LABELS) == dict.fromkeys(REQUEST_LABELS, 1000)
    assert limits_of("50", REQUEST_LABELS) == dict.fromkeys(REQUEST_LABELS, 50)
    assert limits_of("model=20,error_type=8", REQUEST_LABELS) == {"region": 1000, "model": 20,
                                                                   "model_version": 1000, "error_type": 8}


def test_keys_round_trip_any_label_value_and_keep_plain_names_unchanged():
    """Label values come from pods: one holding the keys' separator (or its escape) still makes a key of one
    field per label, read back exactly; a key of ordinary names is the plain join it always was."""
    plain = {"region": "us-east-1", "model": "llama", "model_version": "v1", "track": "canary", "engine": "vllm"}
    key = keys.series_key(plain)
    assert key == keys.SEP.join(plain.values())
    assert keys.labels_of(key) == {**plain}
    hostile = ["a\x1fb", "\x1f", "\x1e", "\x1e0", "\x1e1", "x\x1e1\x1fy", "\x1f\x1e\x1f", "é😀", "stable"]
    for value in hostile:
        for label in ("region", "model", "model_version", "track", "engine"):
            record = {**plain, label: value}
            key = keys.series_key(record)
            assert keys.labels_of(key) == record, (label, value)
            assert keys.region_of(key) == record["region"]
            assert keys.labels_of(keys.global_key(key))["region"] == "global"
            assert keys.split_timed_key(keys.timed_key(key, 123)) == (key, 123)
            deployment = keys.deployment_of_series(key)
            assert deployment == keys.deployment_key(record)
            assert keys.deployment_labels(deployment) == {k: record[k] for k in ("region", "model", "model_version",
                                                                                 "track")}
            for rollup in keys.deployment_rollups(deployment):
                assert len(keys.deployment_labels(rollup)) == 4
    assert len({keys.series_key({**plain, "model": v}) for v in hostile}) == len(hostile)  # distinct stay distinct


def test_the_running_totals_of_a_series_or_deployment_expire_when_it_stops_writing():
    """Keyed state of idle series expires (issue #20 item 3): every value state of the metrics job's per-series
    and per-deployment functions carries a processing-time TTL renewed on each write; 0 keeps it forever."""
    from pyflink.datastream.state import StateTtlConfig

    from infersight.flink_jobs.metrics import functions as F

    class Context:  # what open() asks of Flink's RuntimeContext: the descriptors, to inspect
        def __init__(self):
            self.descriptors = []

        def get_state(self, descriptor):
            self.descriptors.append(descriptor)

    for make in (lambda ttl: F.CumulateSeries(10 * 10**9, ttl_s=ttl),
                 lambda ttl: F.CumulatePods(10 * 10**9, core.Pricing({"default": 1.0}), ttl)):
        ctx = Context()
        make(90.0).open(ctx)
        assert ctx.descriptors
        for d in ctx.descriptors:
            ttl = d._ttl_config  # pyflink keeps it private; it is what goes to the state backend
            assert ttl is not None and ttl.is_enabled() and ttl.get_ttl().to_milliseconds() == 90_000
            assert ttl.get_update_type() == StateTtlConfig.UpdateType.OnCreateAndWrite
            assert ttl.get_state_visibility() == StateTtlConfig.StateVisibility.NeverReturnExpired
            cleanup = ttl.get_cleanup_strategies()
            assert cleanup.get_incremental_cleanup_strategy().get_cleanup_size() == 10 and cleanup.in_full_snapshot()
            # what a task manager converts for Java must not need a py4j gateway (thread mode has none): the
            # default RocksDB filter strategy makes a py4j Duration (the task failed opening its state)
            assert cleanup.get_rocksdb_compact_filter_cleanup_strategy() is None
        ctx = Context()
        make(0.0).open(ctx)
        assert all(d._ttl_config is None for d in ctx.descriptors)
