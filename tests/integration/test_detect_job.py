"""The detect job on the real stack (Kafka, Flink with the Kafka connector, the sink, Prometheus): a labelled
scenario's window-stats records give, through Kafka and Flink, exactly the events ``infersight detect replay``
gives on the same rows; the regional outage becomes one incident of region scope on infersight.anomalies; the
detect metrics reach Prometheus; a poison record goes to the dead-letter topic and nothing else is lost; and end
to end from request records, through the metrics job's window stats, the outage is one region incident."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict

import numpy as np
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from infersight.flink_jobs.detect.stream import JOB, DetectState
from infersight.schemas import pipeline as P
from infersight.schemas import window_stats as W
from infersight.schemas.topics import ANOMALIES, DLQ
from infersight.simulator.scenarios import WINDOW_S, generate, make_scenario
from infersight.stack import jobs as flink
from tests.integration.pipeline_util import prom_value, read_all, wait_until

pytestmark = pytest.mark.integration


def ours(event: dict, tag: str) -> bool:
    models = [event["model"]] if "model" in event else event.get("models", [])
    return any(m.endswith(tag) for m in models)


def scenario_rows(tag: str) -> tuple[list[dict], dict, float]:
    """A labelled regional outage's window-stats rows, moved to end two minutes ago (the job closes its last
    windows on silence) with its models renamed after ``tag`` (only this test's events are compared), its truth
    and the shift applied."""
    scenario = make_scenario(seed=11, hours=1.25, kinds=["regional_outage"])
    (truth,) = scenario.truths()
    shift = time.time() - 120 - (scenario.t0 + scenario.windows * WINDOW_S)
    rows = [{"window_end": t + shift, "region": region, "model": f"{model}-{tag}", "track": track,
             "signal": signal, "value": value} for t, region, model, track, signal, value in generate(scenario)]
    return rows, truth, shift


def produce(bootstrap: str, topic: str, rows: list[dict]) -> None:
    """The rows as the metrics job publishes them: one record per series and window, stamped window end - 1 ms."""
    records: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        records[(r["window_end"], r["region"], r["model"], r["track"])][r["signal"]] = r["value"]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for (t, region, model, track), signals in records.items():
        producer.produce(topic, json.dumps(W.record(t, region, model, track, signals)).encode(),
                         key=f"{region}|{model}|{track}".encode(), timestamp=int(round(t * 1000)) - 1)
    assert producer.flush(60) == 0


def new_topic(bootstrap: str, tag: str, prefix: str = "test-window-stats") -> str:
    topic = f"{prefix}-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client cancels its futures
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    return topic


def replayed(rows: list[dict]) -> list[dict]:
    """What ``infersight detect replay`` gives on these rows, before its final flush, as JSON."""
    expected, _metrics, bad = DetectState().windows(rows)
    assert not bad and expected
    return [json.loads(json.dumps(e, sort_keys=True)) for e in expected]


def job_events(bootstrap: str, tag: str) -> list[dict]:
    return [e for e in (json.loads(m.value()) for m in read_all(bootstrap, ANOMALIES.name)) if ours(e, tag)]


def wait_for_events(bootstrap: str, tag: str, n: int) -> list[dict]:
    return wait_until(lambda: (lambda e: e if len(e) >= n else None)(job_events(bootstrap, tag)), 300,
                      f"the job's {n} events on {ANOMALIES.name}",
                      last_of=lambda: f"{len(job_events(bootstrap, tag))} events")


def submit(lay, tag: str, topic: str, restore_from: str | None = None) -> str:
    return flink.submit(lay, "infersight.flink_jobs.detect.job",
                        ["--brokers", lay.kafka_bootstrap, "--group-id", f"test-detect-{tag}", "--input-topic",
                         topic], restore_from=restore_from)


def test_the_detect_job_gives_the_replays_events_and_the_outage_incident(stack):
    lay = stack.layout
    bootstrap = lay.kafka_bootstrap
    tag = uuid.uuid4().hex[:6]
    rows, truth, shift = scenario_rows(tag)
    topic = new_topic(bootstrap, tag)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"{not json", timestamp=int(rows[0]["window_end"] * 1000) - 1)  # poison, first
    assert producer.flush(30) == 0
    produce(bootstrap, topic, rows)
    expected = replayed(rows)

    job = submit(lay, tag, topic)
    try:
        got = wait_for_events(bootstrap, tag, len(expected))
        assert got == expected  # the same events, in the same order, as the replay of the same rows

        opened = [e for e in got if e["type"] == "incident" and e["event"] == "open"]
        outage = [e for e in opened if set(e["regions"]) == set(truth["regions"])
                  and truth["start"] + shift - WINDOW_S <= e["start"] <= truth["end"] + shift]
        assert outage and outage[0]["scope_kind"] == truth["scope_kind"], opened
        assert all(e["summary"] for e in got)

        anomalies = f'max_over_time({P.prom(P.ANOMALIES)}{{model=~".*-{tag}"}}[2h])'
        wait_until(lambda: (prom_value(lay.prometheus_url, f"sum({anomalies})") or 0) > 0, 90,
                   "the detect job's anomaly counter in Prometheus")
        letters = [json.loads(m.value()) for m in read_all(bootstrap, DLQ.name)]
        assert any(d["job"] == JOB and d["reason"] == "not_json" and d["raw_size"] == len(b"{not json")
                   for d in letters)
    finally:
        flink.stop(lay, job)


def test_a_restored_detect_job_neither_loses_an_incident_nor_raises_it_twice(stack):
    """Cancelled mid-scenario (its open Kafka transaction aborted by the restore) and restored from its
    checkpoint: the committed events are exactly the replay's, each once."""
    lay = stack.layout
    bootstrap = lay.kafka_bootstrap
    tag = uuid.uuid4().hex[:6]
    rows, truth, shift = scenario_rows(tag)
    cut = truth["start"] + shift + 3 * 60  # three minutes into the outage: its incident is open at the cancel
    topic = new_topic(bootstrap, tag)
    expected = replayed(rows)
    assert any(e["type"] == "incident" and e["event"] == "open" and e["start"] < cut for e in expected)

    produce(bootstrap, topic, [r for r in rows if r["window_end"] < cut])
    job = submit(lay, tag, topic)
    try:
        wait_until(lambda: any(e["type"] == "incident" for e in job_events(bootstrap, tag)), 120,
                   "the outage's incident before the cancel")
        before = flink.checkpoint_count(lay, job)
        wait_until(lambda: flink.checkpoint_count(lay, job) >= before + 1, 60, "a checkpoint after it")
        flink.cancel(lay, job)
        wait_until(lambda: flink.job_state(lay, job) == "CANCELED", 60, "the job to cancel")
        checkpoint = flink.latest_checkpoint(lay, job)
        assert checkpoint
        produce(bootstrap, topic, [r for r in rows if r["window_end"] >= cut])
        job = submit(lay, tag, topic, restore_from=checkpoint)
        got = wait_for_events(bootstrap, tag, len(expected))
        assert got == expected  # nothing lost, nothing twice, the open incident carried through the restore
    finally:
        flink.stop(lay, job)


def outage_requests(tag: str, end_s: float, seed: int = 3) -> tuple[list[list[dict]], float, float]:
    """Request records (not window stats) of a regional outage: 60 windows of steady traffic in three regions,
    then 30 where us-east-1 serves a twentieth of its requests, half of them failing, while the other two take
    its load and slow down; per window and region one batch, as normalize writes them. The outage's start and
    end (s)."""
    import dataclasses

    from tests.support.sample_requests import REGIONS, sample_records

    rng = np.random.default_rng(seed)
    t0 = (int(end_s) // WINDOW_S - 90) * WINDOW_S
    outage = (t0 + 60 * WINDOW_S, t0 + 90 * WINDOW_S)
    batches = []
    for w in range(90):
        start_ns = int((t0 + w * WINDOW_S) * 1e9)
        failing = w >= 60
        for region in REGIONS:
            n = int(rng.poisson(1.5 if failing and region == "us-east-1" else 45 if failing else 30))
            records = sample_records(n, start_ns, WINDOW_S, seed=seed * 1000 + w, regions=(region,),
                                     models=(f"llama-{tag}",),
                                     error_rate=0.5 if failing and region == "us-east-1" else 0.002,
                                     slow_region=region if failing and region != "us-east-1" else None)
            batch = [dataclasses.replace(r, track="stable").to_dict() for r in records]
            if batch:
                batches.append(batch)
    return batches, *outage


def test_a_regional_outage_in_request_records_becomes_one_region_incident_through_metrics_and_detect(stack):
    """End to end from requests: the metrics job turns the records into window stats, the detect job reads them,
    and the outage appears as one incident scoped to its region on infersight.anomalies and in Prometheus."""
    lay = stack.layout
    bootstrap = lay.kafka_bootstrap
    tag = uuid.uuid4().hex[:6]
    requests_topic, pods_topic, stats_topic = (new_topic(bootstrap, tag, f"test-e2e-{kind}")
                                               for kind in ("requests", "pods", "window-stats"))
    batches, start, end = outage_requests(tag, time.time() - 60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for batch in batches:
        producer.produce(requests_topic, json.dumps(batch).encode(), key=b"gw",
                         timestamp=max(r["end_ns"] for r in batch) // 1_000_000)
    assert producer.flush(60) == 0

    metrics = flink.submit(lay, "infersight.flink_jobs.metrics.job",
                           ["--brokers", bootstrap, "--group-id", f"test-e2e-metrics-{tag}", "--requests-topic",
                            requests_topic, "--pods-topic", pods_topic, "--window-stats-topic", stats_topic])
    detect = submit(lay, f"e2e-{tag}", stats_topic)
    try:
        def incidents() -> dict[str, dict]:
            """Each incident's latest state (open, then updates as its anomalies join), by id."""
            latest: dict[str, dict] = {}
            for e in job_events(bootstrap, tag):
                if e["type"] == "incident" and start - WINDOW_S <= e["start"] <= end:
                    latest[e["id"]] = e
            return latest

        def outage_named():
            return [e for e in incidents().values() if e["kind"] == "outage"]

        # the last windows close on silence (the quiet watermark: a minute), then the detect job's own delay.
        # The survivors' slowdown can show a window before the failing region's errors: the incident may open as
        # latency in two regions and become the outage as us-east-1's anomalies join it; it stays one incident.
        wait_until(outage_named, 300, "the outage's incident on infersight.anomalies",
                   last_of=lambda: job_events(bootstrap, tag))
        (incident,) = incidents().values()  # one incident, not one per region or signal
        assert incident["scope_kind"] == "region" and incident["regions"] == ["us-east-1"], incident
        assert set(incident["absorbing_regions"]) == {"eu-west-1", "ap-southeast-1"}, incident
        score = f'max_over_time({P.prom(P.ANOMALY_SCORE)}{{region="us-east-1", model="llama-{tag}"}}[30m])'
        wait_until(lambda: (prom_value(lay.prometheus_url, score) or 0) > 0, 120,
                   "the outage's anomaly score in Prometheus")
    finally:
        flink.stop(lay, detect)
        flink.stop(lay, metrics)


def steady_rows(tag: str, quiet_region: str, windows: int = 60, cut: int = 40, heal: int = 50) -> list[dict]:
    """Three regions' steady window stats of one model, ending two minutes ago; ``quiet_region`` sends nothing
    from window ``cut`` until ``heal`` (an established series, then a silence the engine notices)."""
    rng = np.random.default_rng(7)
    t_end = (int(time.time() - 120) // WINDOW_S) * WINDOW_S
    rows = []
    for i in range(windows):
        t = t_end - (windows - 1 - i) * WINDOW_S
        for region in ("ap-southeast-1", "eu-west-1", "us-east-1"):
            if region == quiet_region and cut <= i < heal:
                continue
            signals = {"request_rate": 100 + rng.normal(0, 2), "error_ratio": abs(rng.normal(0.001, 0.0005)),
                       "ttft_p50": 0.1 + rng.normal(0, 0.002), "tokens_per_s": 5000 + rng.normal(0, 50)}
            rows += [{"window_end": float(t), "region": region, "model": f"llama-{tag}", "track": "stable@v1",
                      "signal": s, "value": float(v)} for s, v in signals.items()]
    return rows


def region_status_record(region: str, status: str) -> dict:
    from infersight.schemas import region_status as RS

    now_ms = int(time.time() * 1000)
    return {"region": region, "status": status, "since_ms": now_ms - 9000, "at_ms": now_ms,
            "cause": RS.CAUSE_LINK if status == RS.LINK_DELAYED else "", "link_up": status != RS.LINK_DELAYED,
            "link_lag_s": 42.0, "backlog_records": 1200, "backlog_estimated": True, "gateways": 2,
            "spans_per_s": 30.0, "queue_size": 0, "reason": "integration test"}


def test_a_silent_region_whose_link_is_delayed_is_a_notice_and_with_its_gateways_down_an_outage(stack):
    """Two detect jobs side by side, each with its own window stats and region status topics: eu-west-1 falls
    silent while its status is link_delayed (a malformed status record first: dead-lettered, the job goes on)
    -> a `delayed` notice, no anomaly, no incident, the events the replay gives; the same silence while its status
    is gateways_down -> an outage naming the gateways as its likely cause."""
    from infersight.schemas import region_status as RS

    lay = stack.layout
    bootstrap = lay.kafka_bootstrap
    cases = {}
    for status in (RS.LINK_DELAYED, RS.GATEWAYS_DOWN):
        tag = uuid.uuid4().hex[:6]
        rows = steady_rows(tag, "eu-west-1")
        stats_topic = new_topic(bootstrap, tag)
        status_topic = new_topic(bootstrap, tag, "test-region-status")
        record = region_status_record("eu-west-1", status)
        bad = json.dumps({**record, "region": f"r-{tag}", "status": "on_fire"}).encode()
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(status_topic, bad, key=f"r-{tag}".encode())
        producer.produce(status_topic, json.dumps(record).encode(), key=b"eu-west-1")
        assert producer.flush(30) == 0
        produce(bootstrap, stats_topic, rows)
        state = DetectState()
        state.region_statuses([record])
        expected, _metrics, _bad = state.windows(rows)
        expected = [json.loads(json.dumps(e, sort_keys=True)) for e in expected]
        job = flink.submit(lay, "infersight.flink_jobs.detect.job",
                           ["--brokers", bootstrap, "--group-id", f"test-detect-{tag}", "--input-topic",
                            stats_topic, "--region-status-topic", status_topic])
        cases[status] = (tag, expected, job, bad)
    try:
        for status, (tag, expected, _job, _bad) in cases.items():
            got = wait_for_events(bootstrap, tag, len(expected))
            assert got == expected, status  # the replay's events, the status handed over before the windows
        tag, got, _job, bad = cases[RS.LINK_DELAYED]
        assert not [e for e in got if e["type"] in ("anomaly", "incident")], got
        start, end = [e for e in got if e["type"] == "notice"]
        assert (start["event"], start["kind"], start["region"]) == ("start", "delayed", "eu-west-1")
        assert start["summary"].startswith("telemetry from eu-west-1 delayed (link), lag 42 s"), start
        assert end["event"] == "end" and end["resumed"] == 1, end  # the region's windows came again
        # Prometheus: the region's one series held while the notice was open, then 0 (no other test makes notices)
        held = f'{P.prom(P.HELD_SERIES)}{{region="eu-west-1", kind="delayed"}}'
        wait_until(lambda: prom_value(lay.prometheus_url, f"max(max_over_time({held}[2h]))") == 1, 90,
                   "the held series gauge in Prometheus")
        assert prom_value(lay.prometheus_url, f"min(min_over_time({held}[2h]))") == 0
        letters = [json.loads(m.value()) for m in read_all(bootstrap, DLQ.name)]
        assert any(d["job"] == JOB and d["reason"] == "region_status_unknown_status"
                   and d["raw_size"] == len(bad) for d in letters)

        tag, got, _job, _bad = cases[RS.GATEWAYS_DOWN]
        opened = [e for e in got if e["type"] == "incident" and e["event"] == "open"]
        assert len(opened) == 1 and opened[0]["kind"] == "outage" and opened[0]["regions"] == ["eu-west-1"], got
        assert opened[0]["likely_cause"] == "gateways down in eu-west-1", opened[0]
        assert not [e for e in got if e["type"] == "notice"]
    finally:
        for _tag, _expected, job, _bad in cases.values():
            flink.stop(lay, job)
