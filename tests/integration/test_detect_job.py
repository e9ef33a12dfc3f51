"""The detect job on the real stack (Kafka, Flink with the Kafka connector, the sink, Prometheus): a labelled
scenario's window-stats records give, through Kafka and Flink, exactly the events ``infersight detect replay``
gives on the same rows; the regional outage becomes one incident of region scope on infersight.anomalies; the
detect metrics reach Prometheus; a poison record goes to the dead-letter topic and nothing else is lost."""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict

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


def new_topic(bootstrap: str, tag: str) -> str:
    topic = f"test-window-stats-{tag}"
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
