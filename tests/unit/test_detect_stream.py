"""The detect job's pure parts: the window-stats records the metrics job publishes, their parsing, and the job's
window-by-window processing giving the replay's events whatever the batching and arrival order."""

from __future__ import annotations

import json
import random

from infersight.flink_jobs.common.keys import deployment_key, series_key
from infersight.flink_jobs.detect.stream import DetectState, parse
from infersight.flink_jobs.metrics import detection_signals as D
from infersight.flink_jobs.metrics.core import PodWindow
from infersight.flink_jobs.metrics.window_stats import window_of
from infersight.schemas import metrics as M
from infersight.schemas import window_stats as W
from infersight.simulator.scenarios import generate, make_scenario
from tests.support.sample_requests import sample_records


def test_request_signals_come_from_the_windows_counts_and_merged_sketches():
    records = [r.to_dict() for r in sample_records(400, 1_796_500_000 * 10**9, 8.0, seed=3, models=("m",))]
    stats = window_of(records)
    signals = D.request_signals(stats, 10.0)
    assert signals["request_rate"] == len(records) / 10.0
    assert signals["error_ratio"] == stats.error_count / len(records)
    assert signals["ttft_p99"] >= signals["ttft_p50"] > 0
    record = json.loads(D.request_record(series_key(records[0]), 1_796_500_010 * 10**9, stats, 10.0))
    assert W.record_problem(record) is None and record["window_end"] == 1_796_500_010.0
    assert {r["signal"] for r in W.rows(record)} == set(signals)


def test_pod_records_skip_roll_ups_and_windows_without_pod_signals():
    pods = PodWindow.of([{"metric": M.QUEUE_DEPTH, "region": "eu", "pod": "p1", "time_ns": 1, "value": 3.0},
                         {"metric": M.QUEUE_DEPTH, "region": "eu", "pod": "p2", "time_ns": 1, "value": 4.0}])
    key = deployment_key({"region": "eu", "model": "m", "model_version": "v2", "track": "canary"})
    record = json.loads(D.pod_record(key, 10**10, pods.stats()))
    assert record["track"] == "canary@v2" and record["signals"] == {"queue_depth": 7.0}
    rollup = deployment_key({"region": "eu", "model": "all", "model_version": "all", "track": "all"})
    assert D.pod_record(rollup, 10**10, pods.stats()) is None
    assert D.pod_record(key, 10**10, {}) is None


def test_bad_records_become_dead_letters_with_their_reason():
    for raw, reason in (("{", "not_json"), ("[]", "not_an_object"), ('{"window_end": 1}', "missing_region"),
                        (json.dumps(W.record(-5, "r", "m", "t", {})), "bad_window_end")):
        rows, letter = parse(raw)
        assert rows == [] and json.loads(letter)["reason"] == reason
    rows, letter = parse(json.dumps(W.record(10.0, "r", "m", "t", {"request_rate": 1.0, "future_signal": 2.0})))
    assert letter is None and [r["signal"] for r in rows] == ["request_rate"]  # unknown signals left out


def test_windows_fed_in_batches_and_any_arrival_order_give_the_replays_events():
    rows = [{"window_end": t, "region": r, "model": m, "track": k, "signal": s, "value": v}
            for t, r, m, k, s, v in generate(make_scenario(seed=4, hours=1.0, kinds=["error_burst"]))]
    whole, _, _ = DetectState().windows(rows)
    assert any(e["type"] == "incident" for e in whole)

    state, got = None, []
    by_window: dict[float, list] = {}
    for row in rows:
        by_window.setdefault(row["window_end"], []).append(row)
    rng = random.Random(1)
    windows = sorted(by_window)
    i = 0
    while i < len(windows):  # batches of 1-5 windows, rows shuffled, state through its plain form
        n = rng.randint(1, 5)
        batch = [row for t in windows[i:i + n] for row in by_window[t]]
        rng.shuffle(batch)
        detect = DetectState(json.loads(json.dumps(state)) if state else None)
        events, _, _ = detect.windows(batch)
        got += events
        state = detect.to_state()
        i += n
    assert json.loads(json.dumps(got)) == json.loads(json.dumps(whole))
