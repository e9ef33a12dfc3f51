"""The quality job's every-request drift signals come from the metrics job (issue #17): per request series and metrics
window, bin counts on ``infersight.quality_signals`` (``schemas/quality_signals.py``), so the quality job no longer
reads every request record. Here the same request batches go (a) through the quality job's old path (its own
reading of the records, ``stream.read_requests``; and the two-level grouping before that, ``aggregate.add_requests``)
and (b) through the metrics job's functions (``PreAggregate`` -> ``WindowGroups`` -> ``QualitySignalRecords``, on
a fake keyed runtime, catch-up windows of a delayed region included) and the quality job's new reader
(``stream.read_signals``): the partials, and what the quality engine makes of them, are equal."""

from __future__ import annotations

import json
import random

import numpy as np
import orjson
import pytest

from infersight.flink_jobs.common import request_signals as R
from infersight.flink_jobs.common.keys import series_key
from infersight.flink_jobs.metrics import functions as MF
from infersight.flink_jobs.metrics.quality_signals import signals_record
from infersight.flink_jobs.metrics.window_stats import fact_of, window_of, window_of_groups
from infersight.flink_jobs.quality import functions as QF
from infersight.flink_jobs.quality.aggregate import add_requests
from infersight.flink_jobs.quality.core import EngineParams, Series
from infersight.flink_jobs.quality.stream import (
    QualityState,
    _partials,
    engine_key,
    event_json,
    merge,
    read_requests,
    read_signals,
)
from infersight.schemas import quality_signals as Q
from infersight.schemas.quality import DRIFT_SIGNAL_BY_NAME
from infersight.schemas.records import dump_batch
from infersight.schemas.units import MS, NS
from tests.support.keyed_runtime import Runtime
from tests.support.sample_requests import sample_records

METRICS_WINDOW_MS = 10_000
T0_S = 1_800_000_000  # a boundary of 10 s and of 60 s windows
LATE, CATCHUP, DLQ = "late", "catchup", "dlq"
DELAYED = "ap-southeast-1"


def _traffic(windows: int, seed: int = 11) -> list[dict]:
    """Requests over ``windows`` metrics windows: 3 regions x 2 models, versions, tracks, every finish reason and error
    kind (some requests without TTFT or token counts), and a few copies of one request (a retried export)."""
    rng = random.Random(seed)
    records = []
    for w in range(windows):
        start_ns = (T0_S * 1000 + w * METRICS_WINDOW_MS) * MS
        for r in sample_records(240, start_ns, METRICS_WINDOW_MS / 1000, seed=seed + w, error_rate=0.1):
            rec = r.to_dict()
            rec["model_version"] = rng.choice(("v1", "v2", None))
            rec["track"] = rng.choice(("stable", "canary", None))
            rec["finish_reason"] = rng.choice(("stop", "length", "content_filter", "tool_calls", "error", "abort"))
            if rec["error_type"] is not None:
                rec["error_type"] = rng.choice(("TimeoutError", "503", "invalid_request", "cancelled", "Boom", "404"))
                rec["finish_reason"] = rng.choice(("error", None))  # the contract's: none only with an error
            if rng.random() < 0.05:  # no first token (the contract's: then no output tokens)
                rec["ttft_s"], rec["tokens_out"] = None, 0
            if rng.random() < 0.03:  # no prompt token count (and so no cached ones)
                rec["tokens_in"] = rec["tokens_cached"] = None
            records.append({k: v for k, v in rec.items() if v is not None})
    records += [dict(records[7]) for _ in range(3)]  # copies: counted once per copy by both paths
    return records


def _batches(records: list[dict], size: int = 150) -> list[str]:
    """Normalizer-like messages: in end order, each a JSON array (batches straddle window boundaries)."""
    ordered = sorted(records, key=lambda r: r["end_ns"])
    return [dump_batch(ordered[i:i + size]) for i in range(0, len(ordered), size)]


def _merged(partials_of_messages) -> dict:
    """Every message's partials merged per (engine key, window end ms), as the quality job's window operator does."""
    pending: dict = {}
    for partials in partials_of_messages:
        for key, (n, partial) in partials.items():
            waiting_n, waiting = pending.get(key) or (0, None)
            pending[key] = (waiting_n + n, merge(waiting, partial))
    return pending


def _old_path(messages: list[str], window_s: int) -> dict:
    out = []
    for message in messages:
        partials, letters = read_requests(message, window_s)
        assert not letters
        out.append(partials)
    return _merged(out)


def _signal_messages(on_time: list[str], delayed: list[str]) -> list[str]:
    """The metrics job's functions over the messages: ``on_time`` read as the watermark follows them; then
    ``delayed`` (a region's backlog, its link back after the others moved event time past it) read behind the
    watermark, within the catch-up bound, fired once quiet. Returns the quality-signals records of every window."""
    pre = Runtime(MF.PreAggregate(METRICS_WINDOW_MS, LATE, DLQ, catchup_ms=900_000))
    windows = Runtime(MF.WindowGroups(window_of_groups, 5_000, 900.0, LATE, CATCHUP), key_of=MF.first)
    to_records = MF.QualitySignalRecords(METRICS_WINDOW_MS)
    results = []

    def read(message: str) -> None:
        out = pre.send(message)
        assert not [o for o in out if o[0] in (LATE, DLQ)]
        for element in out:
            results.extend(windows.send(element))

    for message in on_time:
        read(message)
        newest_ms = max(r["end_ns"] for r in orjson.loads(message)) // MS
        pre.watermark = newest_ms - 3_000  # the metrics job's 3 s out-of-orderness
        results.extend(windows.advance(watermark=pre.watermark))
    results.extend(windows.advance(watermark=pre.watermark + 60_000))
    pre.watermark = windows.watermark
    for i, message in enumerate(delayed):  # the backlog: every window behind the watermark, within the bound
        windows.now = 1_000 * i
        read(message)
    results.extend(windows.advance(now=10**9))  # quiet: the catch-up windows fire
    catchup = [r[1] for r in results if len(r) == 2 and r[0] == CATCHUP]
    on_time_results = [r for r in results if not (len(r) == 2 and r[0] == CATCHUP)]
    assert catchup and on_time_results and windows.counters["late_groups"].n == 0
    return [m for result in on_time_results + catchup for m in to_records(result)]


def _new_path(signal_messages: list[str], window_s: int) -> dict:
    out = []
    for message in signal_messages:
        partials, letters = read_signals(message, window_s)
        assert not letters, letters
        out.append(partials)
    return _merged(out)


def _assert_same_partials(new: dict, old: dict) -> None:
    assert sorted(new) == sorted(old)
    for key, (n, partial) in old.items():
        n_new, partial_new = new[key]
        assert n_new == n and set(partial_new) == set(partial), key
        for series, agg in partial.items():
            got = partial_new[series]
            assert got.evaluators == agg.evaluators == {} and set(got.histograms) == set(agg.histograms) == set(
                Q.REQUEST_SIGNALS)
            for name, h in agg.histograms.items():
                assert got.histograms[name].n == h.n and np.array_equal(got.histograms[name].counts, h.counts), \
                    (key, series, name)


@pytest.mark.parametrize("window_s", [10, 60])
def test_the_metrics_jobs_signals_give_the_quality_engine_exactly_what_the_request_records_gave(window_s):
    records = _traffic(13)
    on_time = [r for r in records if r["region"] != DELAYED or r["end_ns"] < (T0_S + 60) * NS]
    delayed = [r for r in records if r not in on_time]  # the delayed region's windows from the 7th on
    assert delayed
    messages = _batches(on_time) + _batches(delayed, 40)
    old = _old_path(messages, window_s)
    signals = _signal_messages(_batches(on_time), _batches(delayed, 40))
    assert len({(m["window_end_ms"], m["region"], m["model"], m["model_version"], m["track"], m["engine"])
                for m in map(json.loads, signals)}) == len(signals)  # one record per series and window
    new = _new_path(signals, window_s)
    _assert_same_partials(new, old)
    # the two-level grouping the one-pass reader replaced: the same histograms again (an independent binning)
    two_level = _partials(records, "end_ns", window_s, add_requests)
    assert sorted(two_level) == sorted(old)
    _assert_same_partials(new, {k: (n, p) for k, (n, p) in two_level.items()})
    assert sum(n for n, _ in new.values()) == len(records)
    # ... and the quality engine's outputs, window after window, are the same (a canary measured against stable)
    params = EngineParams(baseline="stable_track")
    outputs = []
    for pending in (old, new):
        states: dict[str, QualityState] = {}
        outs = []
        for key, end_ms in sorted(pending, key=lambda k: (k[1], k[0])):
            state = states.setdefault(key, QualityState(None, params))
            records_out, metrics = state.close(end_ms // 1000, pending[(key, end_ms)][1])
            outs.append((key, end_ms, [event_json(r) for r in records_out], metrics))
        outputs.append(outs)
    assert outputs[0] == outputs[1]
    assert any(json.loads(r)["drift"] for _k, _e, rs, _m in outputs[1] for r in rs)  # distances were measured


def test_a_signals_record_is_the_window_of_its_groups_and_passes_the_contract():
    records = [r.to_dict() for r in sample_records(300, T0_S * NS, 9.9, seed=4, regions=("r1",), models=("m",))]
    for r in records:
        r["track"] = "stable"  # one series
    halves = [records[:120], records[120:]]
    rows = [tuple(R.signal_rows([h]).tolist()[0]) for h in halves]
    stats = window_of_groups([([], rows[0]), ([], rows[1])])
    assert stats.quality_signals == tuple(R.signal_rows([records]).tolist()[0])  # rows add
    key = series_key({"region": "r1", "model": "m", "model_version": "v1", "track": "stable", "engine": "vllm"})
    message = json.loads(signals_record(key, (T0_S + 10) * NS, stats, METRICS_WINDOW_MS))
    assert Q.problems(message) == []
    assert (message["window_end_ms"], message["window_ms"], message["requests"]) == ((T0_S + 10) * 1000, 10_000, 300)
    assert (message["region"], message["model"], message["model_version"], message["track"], message["engine"]) == \
        ("r1", "m", "v1", "stable", "vllm")
    for name in Q.REQUEST_SIGNALS:
        assert len(message["signals"][name]["counts"]) == DRIFT_SIGNAL_BY_NAME[name].bins
    assert message["signals"]["ttft"]["n"] == sum(r.get("ttft_s") is not None for r in records)
    assert signals_record(key, (T0_S + 10) * NS, window_of(records), METRICS_WINDOW_MS) is None  # no signals: none
    # a roll-up's merge leaves the signals out; a bare fact (a group from a job before them) leaves none either
    old_state = window_of_groups([([], rows[0]), fact_of(records[0])])
    assert old_state.requests == 1 and old_state.quality_signals is None


def _valid(**changes) -> dict:
    row = R.signal_rows([[{"tokens_in": 10, "tokens_out": 3, "ttft_s": 0.1, "finish_reason": "stop"},
                          {"tokens_in": 20, "tokens_out": 0, "error_type": "503", "finish_reason": "error"}]])[0]
    signals = R.signals_of(row)
    rec = Q.record((T0_S + 10) * 1000, 10_000, {"region": "r1", "model": "m", "model_version": "", "track": "stable",
                                                "engine": "vllm"}, 2, signals)
    rec.update(changes)
    return rec


@pytest.mark.parametrize(("change", "field"), [
    ({"window_ms": 0}, "window_ms"),
    ({"window_end_ms": (T0_S + 10) * 1000 + 1}, "window_end_ms"),
    ({"region": ""}, "region"),
    ({"model": 5}, "model"),
    ({"requests": 0}, "requests"),
    ({"requests": True}, "requests"),
    ({"signals": []}, "signals"),
    ({"signals": {"tokens_in": {"n": 2, "counts": [2]}}}, "signals.tokens_in.counts"),
])
def test_a_malformed_signals_record_is_dead_lettered_with_its_field(change, field):
    partials, letters = read_signals(orjson.dumps(_valid(**change)), 10)
    assert partials == {} and len(letters) == 1
    letter = json.loads(letters[0])
    assert field in letter["reason"] and letter["job"] == "infersight-quality"
    assert letter["source"]["topic"] == "infersight.quality_signals"


def test_signals_dead_letters_the_rest_and_reads_what_is_valid():
    valid = _valid()
    bad_counts = _valid()
    bad_counts["signals"] = {**valid["signals"], "ttft": {"n": 1, "counts": [0] * 17}}
    missing = {k: v for k, v in valid.items() if k != "engine"}
    partials, letters = read_signals(orjson.dumps([valid, bad_counts, missing, 5]), 60)
    assert [json.loads(x)["reason"].split(":")[0] for x in letters] == ["signals.ttft.n", "engine", "record"]
    ((key, (n, partial)),) = partials.items()
    assert key == (engine_key("r1", "m"), (T0_S + 60) * 1000) and n == 2
    ((series, agg),) = partial.items()
    assert series == Series("r1", "m", "", "stable")
    assert list(agg.histograms["error_type"].counts) == [1, 0, 0, 1, 0, 0]  # none, server (503)
    assert list(agg.histograms["finish_reason"].counts) == [1, 0, 0, 0, 1, 0]
    assert agg.histograms["ttft"].n == 1 and agg.histograms["tokens_in"].n == 2
    _, letters = read_signals(b"\xff not json", 60)
    assert len(letters) == 1 and "not a JSON" in json.loads(letters[0])["reason"]


def test_a_metrics_window_straddling_two_quality_windows_is_dead_lettered():
    # 10 s metrics windows in 15 s quality windows: [T0+10, T0+20) straddles T0+15
    partials, letters = read_signals(orjson.dumps(_valid(window_end_ms=(T0_S + 20) * 1000)), 15)
    assert partials == {} and "straddles two quality windows" in json.loads(letters[0])["reason"]
    partials, letters = read_signals(orjson.dumps(_valid(window_end_ms=(T0_S + 30) * 1000)), 15)
    assert not letters and list(partials) == [(engine_key("r1", "m"), (T0_S + 30) * 1000)]


def test_the_job_reader_turns_signals_into_partials_folding_labels_past_their_bound():
    class _Ctx:
        def timer_service(self):
            return self

        def current_processing_time(self):
            return 0

    runtime = Runtime(QF.ReadBatches(QF.SIGNALS_KIND, 60, "dlq-tag", "infersight.quality_signals",
                                     {"region": 5, "model": 1, "model_version": 5, "track": 5, "evaluator": 5}))
    out = list(runtime.fn.process_element(orjson.dumps(_valid()).decode(), _Ctx()))
    out += list(runtime.fn.process_element(orjson.dumps(_valid(model="m2")).decode(), _Ctx()))
    assert [(key, end_ms, n) for key, end_ms, n, _p in out] == [
        (engine_key("r1", "m"), (T0_S + 60) * 1000, 2), (engine_key("r1", "_OTHER"), (T0_S + 60) * 1000, 2)]
    assert runtime.counters["records"].n == 4 and runtime.counters["folded_model"].n == 1
    letters = list(runtime.fn.process_element("{}", _Ctx()))
    assert [tag for tag, _ in letters] == ["dlq-tag"] and runtime.counters["dead_letters"].n == 1
    with pytest.raises(ValueError, match="kind"):
        QF.ReadBatches("pods", 60, "dlq", "t")
