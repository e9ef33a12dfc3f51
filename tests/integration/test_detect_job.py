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


def test_the_detect_job_gives_the_replays_events_and_the_outage_incident(stack):
    lay = stack.layout
    bootstrap = lay.kafka_bootstrap
    tag = uuid.uuid4().hex[:6]
    scenario = make_scenario(seed=11, hours=1.25, kinds=["regional_outage"])
    (truth,) = scenario.truths()
    # the scenario's windows moved to end two minutes ago (the job closes its last windows on silence), its
    # models renamed so that only this test's events are compared
    shift = time.time() - 120 - (scenario.t0 + scenario.windows * WINDOW_S)
    rows = [{"window_end": t + shift, "region": region, "model": f"{model}-{tag}", "track": track,
             "signal": signal, "value": value} for t, region, model, track, signal, value in generate(scenario)]

    topic = f"test-window-stats-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    records: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        records[(r["window_end"], r["region"], r["model"], r["track"])][r["signal"]] = r["value"]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    producer.produce(topic, b"{not json", timestamp=int(rows[0]["window_end"] * 1000) - 1)  # poison, first
    for (t, region, model, track), signals in records.items():  # as the metrics job stamps them: window end - 1 ms
        producer.produce(topic, json.dumps(W.record(t, region, model, track, signals)).encode(),
                         key=f"{region}|{model}|{track}".encode(), timestamp=int(round(t * 1000)) - 1)
    assert producer.flush(60) == 0

    expected, _metrics, bad = DetectState().windows(rows)  # what the replay gives, before its final flush
    expected = [json.loads(json.dumps(e, sort_keys=True)) for e in expected]
    assert not bad and expected

    job = flink.submit(lay, "infersight.flink_jobs.detect.job",
                       ["--brokers", bootstrap, "--group-id", f"test-detect-{tag}", "--input-topic", topic])
    try:
        def events() -> list[dict]:
            return [e for e in (json.loads(m.value()) for m in read_all(bootstrap, ANOMALIES.name)) if ours(e, tag)]
        got = wait_until(lambda: (lambda e: e if len(e) >= len(expected) else None)(events()), 300,
                         f"the job's {len(expected)} events on {ANOMALIES.name}",
                         last_of=lambda: f"{len(events())} events")
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
