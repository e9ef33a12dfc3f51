"""Catch-up windows (issue #25 item 3): a delayed region's records land in their own windows. The metrics job's
Flink functions driven without a cluster: a fake keyed runtime (state per key, event- and processing-time
timers) stands for Flink's, as in ``test_quality_functions.py``. The real stack runs them in
``tests/integration/test_multiregion.py``."""

from __future__ import annotations

import json
from collections import Counter

import orjson
import pytest
import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.flink_jobs.common import keys
from infersight.flink_jobs.metrics import core, job
from infersight.flink_jobs.metrics import functions as F
from infersight.flink_jobs.metrics.window_stats import WindowStats, window_of, window_of_groups
from infersight.schemas import pipeline as P
from infersight.schemas.units import MS
from tests.support.keyed_runtime import Runtime
from tests.support.sample_requests import sample_records

W_MS = 10_000
W_NS = W_MS * MS
T0_MS = 1_790_000_000_000  # a window boundary
QUIET_MS = 5_000
A, B, C = "us-east-1", "eu-west-1", "ap-southeast-1"
LATE, CATCHUP, DLQ = "late", "catchup", "dlq"


def _tagged(out, tag):
    return [o[1] for o in out if len(o) == 2 and o[0] == tag]


def _main(out):
    return [o for o in out if not (len(o) == 2 and o[0] in (LATE, CATCHUP, DLQ))]


def _records(region, window, n, seed):
    """``n`` requests of ``region`` ending in window ``window`` (0: the one starting at T0)."""
    start = (T0_MS + window * W_MS) * MS
    return [{**r.to_dict(), "track": "stable"}  # one series per region
            for r in sample_records(n, start, W_MS / 1000 - 0.001, seed=seed, regions=(region,), models=("llama",))]


def _batch(records):
    return orjson.dumps(records).decode()


def _end(window):
    return T0_MS + (window + 1) * W_MS


def _pre(catchup_ms=0):
    return Runtime(F.PreAggregate(W_MS, LATE, DLQ, catchup_ms=catchup_ms))


# ---- PreAggregate ----

def test_records_behind_the_watermark_within_the_bound_are_grouped_and_older_ones_go_late():
    pre = _pre(catchup_ms=900_000)
    pre.watermark = _end(100) + 5_000  # the other regions moved event time on 1,000 s past window 0
    within = _records(C, 20, 30, seed=1)   # ended 800 s behind: a catch-up window
    beyond = _records(C, 5, 20, seed=2)    # 950 s behind: past the bound
    on_time = _records(C, 101, 10, seed=3)
    out = pre.send(_batch(within + beyond + on_time))
    late = _tagged(out, LATE)
    assert [(key, end, len(rs)) for key, end, rs in late] == [(keys.series_key(beyond[0]), None, 20)]
    groups = {value[1]: value for value in _main(out)}
    assert set(groups) == {_end(20), _end(101)}
    catchup, fresh = groups[_end(20)], groups[_end(101)]
    assert catchup[0] == keys.timed_key(keys.series_key(within[0]), _end(20))
    assert window_of_groups(catchup[2]).requests == 30 and json.loads(catchup[3]) == within  # the records ride along
    assert len(fresh) == 3 and window_of_groups(fresh[2]).requests == 10  # on time: the element it always was
    assert pre.counters["records"].n == 60


def test_without_a_bound_every_record_behind_the_watermark_is_late_as_before():
    records = _records(C, 20, 30, seed=1) + _records(C, 101, 10, seed=3)
    outs = []
    for catchup_ms in (0, None):
        pre = _pre() if catchup_ms is None else _pre(catchup_ms)
        pre.watermark = _end(100)
        outs.append(pre.send(_batch(records)))
    assert outs[0] == outs[1]
    assert [len(rs) for _k, _e, rs in _tagged(outs[0], LATE)] == [30] and len(_main(outs[0])) == 1


def test_pod_points_behind_the_watermark_within_the_bound_are_grouped_beyond_it_counted_late():
    def point(window, pod):
        return {"region": C, "model": "llama", "model_version": "v1", "track": "stable", "pod": pod,
                "metric": "infersight.server.queue.depth", "value": 3.0,
                "time_ns": (T0_MS + window * W_MS + 1_000) * MS}

    pods = Runtime(F.PreAggregatePods(W_MS, DLQ, catchup_ms=900_000))
    pods.watermark = _end(100)
    out = pods.send(json.dumps([point(20, "p1"), point(20, "p2"), point(5, "p1")]))
    assert {end for _key, end, _w in out} == {_end(20)} and len(out) == 4  # the deployment and its 3 roll-ups
    assert pods.counters["late_gauges"].n == 1


# ---- WindowGroups ----

def _groups(late_tag=LATE, reduce=window_of_groups):
    return Runtime(F.WindowGroups(reduce, QUIET_MS, 900.0, late_tag, CATCHUP), key_of=F.first)


def test_a_catch_up_window_fires_once_after_the_quiet_time_with_every_group():
    pre, windows = _pre(catchup_ms=900_000), _groups()
    pre.watermark = windows.watermark = _end(100)
    sent = [_records(C, 20, n, seed=n) for n in (40, 25, 10)]
    for i, records in enumerate(sent):  # one window's backlog in three batches, 2 s apart
        windows.now = i * 2_000
        [element] = _main(pre.send(_batch(records)))
        assert windows.send(element) == []
        assert [t for t in windows.timers if t[0] == "proc"] == [("proc", i * 2_000 + QUIET_MS, element[0])]
    assert not [t for t in windows.timers if t[0] == "event"]  # not an event-time timer: the watermark is past
    assert windows.advance(now=4_000 + QUIET_MS - 1) == []  # re-armed by the last group
    out = windows.advance(now=4_000 + QUIET_MS)
    [(key, end_ns, stats)] = _tagged(out, CATCHUP)
    assert _main(out) == [] and (key, end_ns) == (keys.series_key(sent[0][0]), _end(20) * MS)
    assert stats.requests == 75 and stats.tokens == window_of(r for rs in sent for r in rs).tokens
    assert windows.counters["catchup_windows"].n == 1
    # a group for the window after it fired: late, whole, never a second result
    again = _records(C, 20, 5, seed=99)
    [element] = _main(pre.send(_batch(again)))
    [(late_key, none, records)] = _tagged(windows.send(element), LATE)
    assert (late_key, none, records) == (key, None, again) and windows.counters["late_groups"].n == 1
    assert windows.advance(now=60_000) == [] and not windows.timers


def test_on_time_windows_fire_on_their_event_time_timer_exactly_as_without_catch_up():
    records = [_records(A, 0, 30, seed=5), _records(A, 1, 20, seed=6), _records(B, 0, 10, seed=7)]
    results = []
    for windows in (_groups(), Runtime(F.WindowGroups(window_of_groups), key_of=F.first)):
        pre = _pre(catchup_ms=900_000)
        pre.watermark = windows.watermark = T0_MS - 1
        for batch in records:
            for element in _main(pre.send(_batch(batch))):
                assert windows.send(element) == []
        assert sorted(t[1] for t in windows.timers) == [_end(0) - 1, _end(0) - 1, _end(1) - 1]
        out = windows.advance(watermark=_end(1))
        results.append([(key, end, stats.requests, stats.tokens) for key, end, stats in out])
    assert results[0] == results[1] and sorted(r[2] for r in results[0]) == [10, 20, 30]
    # a backlog's group for a window that fired on time goes late, not into a second result
    windows = _groups()
    windows.watermark = T0_MS - 1
    pre = _pre(catchup_ms=900_000)
    for element in _main(pre.send(_batch(records[0]))):
        windows.send(element)
    assert len(windows.advance(watermark=_end(0))) == 1
    pre.watermark = _end(0)
    more = _records(A, 0, 3, seed=8)
    [element] = _main(pre.send(_batch(more)))
    assert len(element) == 4 and _tagged(windows.send(element), LATE)[0][2] == more


def test_pod_windows_catch_up_too_and_a_group_after_they_fired_is_counted_and_dropped():
    pod_window = core.PodWindow.of([{"region": C, "pod": "p1", "metric": "infersight.server.queue.depth",
                                     "value": 2.0, "time_ns": (T0_MS + 1_000) * MS}])
    windows = _groups(late_tag=None, reduce=core.merged_pod_windows)
    windows.watermark = _end(100)
    key = keys.timed_key(keys.deployment_key({"region": C, "model": "llama"}), _end(0))
    assert windows.send((key, _end(0), [pod_window])) == []
    [(_k, end_ns, merged)] = _tagged(windows.advance(now=QUIET_MS), CATCHUP)
    assert end_ns == _end(0) * MS and merged.stats()["infersight.server.queue.depth"]
    assert windows.send((key, _end(0), [pod_window])) == [] and windows.counters["late_groups"].n == 1


# ---- CumulateSeries ----

def _points(batches):
    """Every point of the metrics batches as ``(metric, labels, time ns) -> value``; asserts that no series
    gets two values at one timestamp (what Prometheus would refuse)."""
    points = {}
    for batch in batches:
        for rm in ExportMetricsServiceRequest.FromString(batch).resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        labels = tuple(sorted((a.key, a.value.string_value) for a in p.attributes))
                        at = (m.name if kind in ("gauge", "sum") else f"{m.name} {kind}", labels, p.time_unix_nano)
                        assert at not in points, f"two values for {at}"
                        points[at] = p.as_double if kind in ("gauge", "sum") else p.count
    return points


def _series(points, name, region):
    """``{time ns: value}`` of one metric of the series in ``region``."""
    return {t: v for (n, labels, t), v in points.items() if n == name and (P.LABEL_REGION, region) in labels}


def _series_runtime():
    return Runtime(F.CumulateSeries(W_NS), key_of=F.first)


def test_catch_up_windows_behind_the_series_last_point_write_their_gauges_at_their_time_and_join_the_totals():
    series = keys.series_key(_records(C, 0, 1, seed=1)[0])
    cumulate = _series_runtime()
    windows = {w: window_of(_records(C, w, 10 + w, seed=w)) for w in range(7)}
    out = []
    for w in (0, 1):  # on time, then the cut: the region's series had nothing after window 1
        out += cumulate.send((series, _end(w) * MS, windows[w]))
    for w in (2, 3):  # catch-up windows after its last point: windows at their own (past) times
        out += cumulate.send((series, _end(w) * MS, windows[w]))
    assert len(out) == 4
    out += cumulate.send((series, _end(6) * MS, windows[6]))  # after the heal its new window fires first
    for w in (4, 5):  # the rest of the backlog: behind the last point, gauges alone at their own times
        out += cumulate.send((series, _end(w) * MS, windows[w]))
    assert len(out) == 7 and cumulate.timers
    out += cumulate.advance(now=2 * W_MS)  # the flush: the totals 1 ms after the last point
    points = _points(out)
    per_window = _series(points, P.WINDOW_REQUESTS, C)
    assert per_window == {_end(w) * MS: float(windows[w].requests) for w in range(7)}
    requests = _series(points, P.REQUESTS, C)
    assert max(requests) == _end(6) * MS + MS and requests[max(requests)] == sum(s.requests for s in windows.values())
    assert all(t in (_end(w) * MS for w in (0, 1, 2, 3, 6)) or t == _end(6) * MS + MS for t in requests)
    ordered = [requests[t] for t in sorted(requests)]
    assert ordered == sorted(ordered)  # a counter: never steps back, and no counter point at an older time


# ---- the roll-up, and the whole path of a delayed region ----

def test_a_late_regional_result_supersedes_the_roll_up_window_once_and_keeps_the_global_counters_exact():
    rollup = Runtime(F.RollupWindows(900.0), key_of=F.global_window_key)
    cumulate = _series_runtime()
    stats = {r: window_of(_records(r, 0, n, seed=n)) for r, n in ((A, 30), (B, 20), (C, 10))}
    series = {r: keys.series_key(_records(r, 0, 1, seed=1)[0]) for r in stats}
    rollup.watermark = T0_MS
    for r in (A, B):
        assert rollup.send((series[r], _end(0) * MS, stats[r])) == []
    out = rollup.advance(watermark=_end(0))
    [(gkey, end_ns, merged, regions)] = out
    assert (gkey, end_ns, merged.requests, regions) == (keys.global_key(series[A]), _end(0) * MS, 50, 2)
    [late] = rollup.send((series[C], _end(0) * MS, stats[C]))  # the delayed region's window, after the fire
    assert late[0] == gkey and late[1] == _end(0) * MS + MS and late[2].requests == 60 and late[3] == 3
    assert late[4].requests == 10  # its own part, for the running totals
    batches = [b for element in out + [late] for b in cumulate.send(element)]
    batches += cumulate.advance(now=2 * W_MS)
    points = _points(batches)  # (no two values for one series and timestamp)
    assert _series(points, P.WINDOW_REQUESTS, "global") == {_end(0) * MS: 50.0, _end(0) * MS + MS: 60.0}
    assert _series(points, P.ROLLUP_REGIONS, "global") == {_end(0) * MS: 2.0, _end(0) * MS + MS: 3.0}
    requests = _series(points, P.REQUESTS, "global")
    assert [requests[t] for t in sorted(requests)] == [50.0, 60.0]  # the late region's part: in the totals' flush
    p99 = P.DISTRIBUTIONS["ttft_s"][0] + P.WINDOW_QUANTILE_SUFFIX
    quantiles = {t: v for (n, labels, t), v in points.items() if n == p99 and ("quantile", "0.99") in labels}
    whole = WindowStats()
    for s in stats.values():
        whole.merge(s)
    assert quantiles[_end(0) * MS + MS] == pytest.approx(whole.dists["ttft_s"].quantile(0.99))
    # a window no region had on time (all delayed) fires at once; the next region's result supersedes it
    rollup.watermark = _end(5)
    [(_g, end_ns, merged, regions)] = rollup.send((series[B], _end(1) * MS, stats[B]))
    assert (end_ns, merged.requests, regions) == (_end(1) * MS, 20, 1)
    [(_g, stamp, merged, regions, own)] = rollup.send((series[C], _end(1) * MS, stats[C]))
    assert (stamp, merged.requests, regions, own.requests) == (_end(1) * MS + MS, 30, 2, 10)


def test_a_region_delayed_past_idleness_counts_every_request_once_in_its_own_windows():
    """The whole path with fakes: us-east-1 and eu-west-1 on time; ap-southeast-1's link cut after window 1, its
    backlog (windows 2-5) drained once the others' watermark is past window 5. With a 30 s bound window 2 is
    beyond it (late: counted, in the totals), windows 3-5 are catch-up windows. Per region and window, the
    window gauge equals what was sent; every counter ends at what was sent; the roll-up's windows 3-5 are
    superseded with all three regions."""
    catchup_ms = 30_000
    pre = _pre(catchup_ms)
    windows = Runtime(F.WindowGroups(window_of_groups, QUIET_MS, catchup_ms / 1000, LATE, CATCHUP), key_of=F.first)
    rollup = Runtime(F.RollupWindows(catchup_ms / 1000), key_of=F.global_window_key)
    cumulate = _series_runtime()
    batches, late_records = [], []

    def to_series(elements):
        for element in elements:
            batches.extend(cumulate.send(element))

    def results(out):  # a regional window's result: to the roll-up and to its series
        late = _tagged(out, LATE)
        late_records.extend(r for _k, _n, rs in late for r in rs)
        to_series(e for t in late for e in F.late_series(t))
        for result in _main(out) + _tagged(out, CATCHUP):
            to_series(rollup.send(result))
            to_series([result])

    def tick(watermark=None, now=None):  # a watermark reaches each operator after what the one before emitted
        pre.advance(watermark, now)
        results(windows.advance(watermark, now))
        to_series(rollup.advance(watermark, now))
        batches.extend(cumulate.advance(watermark, now))

    def read(records):
        out = pre.send(_batch(records))
        late = _tagged(out, LATE)
        late_records.extend(r for _k, _n, rs in late for r in rs)
        to_series(e for t in late for e in F.late_series(t))
        for element in _main(out):
            results(windows.send(element))

    sent = {(r, w): _records(r, w, 20 + 7 * w + 3 * i, seed=100 * i + w)
            for i, r in enumerate((A, B, C)) for w in range(6)}
    now = 0
    for w in range(6):
        now += W_MS
        tick(watermark=T0_MS + w * W_MS - 1, now=now)
        for r in (A, B, C) if w < 2 else (A, B):
            read(sent[(r, w)])
    tick(watermark=_end(5) + 1, now=now + W_MS)  # the others' partitions moved event time past window 5
    for w in range(2, 6):  # the heal: the backlog drains in event-time order, two batches per window
        for half in (0, 1):
            now += 1_000
            tick(now=now)
            records = sent[(C, w)]
            read(records[half * len(records) // 2:(half + 1) * len(records) // 2])
    tick(now=now + 60_000)  # quiet: the catch-up windows fire, then the flushes
    tick(now=now + 120_000)
    points = _points(batches)
    for r in (A, B, C):
        gauge = _series(points, P.WINDOW_REQUESTS, r)
        expected = {_end(w) * MS: float(len(sent[(r, w)])) for w in range(6) if (r, w) != (C, 2)}
        assert gauge == expected, r
        assert max(_series(points, P.REQUESTS, r).values()) == sum(len(sent[(r, w)]) for w in range(6)), r
    assert Counter(rec["region"] for rec in late_records) == {C: len(sent[(C, 2)])}  # beyond the bound: late
    assert max(_series(points, P.REQUESTS, "global").values()) == sum(map(len, sent.values()))
    roll = _series(points, P.WINDOW_REQUESTS, "global")
    for w in range(6):
        all_three = float(sum(len(sent[(r, w)]) for r in (A, B, C)))
        if w < 2:
            assert roll[_end(w) * MS] == all_three
        elif w == 2:  # C's window 2 was late: the roll-up's window stays partial, its counters have it
            assert roll[_end(w) * MS] == all_three - len(sent[(C, w)]) and _end(w) * MS + MS not in roll
        else:  # partial when first written, then superseded 1 ms later with all three regions
            assert roll[_end(w) * MS] == all_three - len(sent[(C, w)]) and roll[_end(w) * MS + MS] == all_three
    regions = _series(points, P.ROLLUP_REGIONS, "global")
    assert [regions[_end(w) * MS] for w in range(6)] == [3.0, 3.0, 2.0, 2.0, 2.0, 2.0]
    assert [regions[_end(w) * MS + MS] for w in range(3, 6)] == [3.0, 3.0, 3.0]
    assert windows.counters["catchup_windows"].n == 3 and windows.counters["late_groups"].n == 0  # C: windows 3-5


# ---- what the catch-up needs around the job ----

def test_the_job_documents_its_bound_and_prometheus_accepts_samples_that_old(capsys):
    assert job.CATCHUP_S >= 600  # issue #25: at least 10 minutes
    with pytest.raises(SystemExit):
        job.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--catchup-s CATCHUP_S catch-up bound" in help_text and "--catchup-quiet-s" in help_text
    from infersight.stack import paths

    config = yaml.safe_load(paths.stack_config("prometheus/prometheus.yml").read_text())
    window = config["storage"]["tsdb"]["out_of_order_time_window"]
    assert window.endswith("m") and int(window[:-1]) * 60 >= 2 * job.CATCHUP_S


def test_a_catch_up_result_is_stamped_with_its_windows_last_millisecond():
    assert F.WindowEndStamp().extract_timestamp(("k", _end(3) * MS, None), 123) == _end(3) - 1
    assert F.global_window_key((keys.series_key(_records(C, 0, 1, seed=1)[0]), _end(3) * MS, None)) == \
        keys.timed_key(keys.global_key(keys.series_key(_records(C, 0, 1, seed=1)[0])), _end(3))
    assert F.catchup_marked(("k", 1, "pods")) == ("k", 1, "pods", True)
