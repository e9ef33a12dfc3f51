"""The cardinality bound on the real stack (issue #20 item 3; the full attack, 1,000,000 names through the gateways,
is ``bench/cardinality.py``): one metrics job with ``--max-label-values model=50`` reads this test's own topics,
where request batches as normalize writes them carry 20,000 model names, each used once, mixed with two
well-behaved models of known counts that were there first. In Prometheus: 51 model values (50 admitted and
``_OTHER``), the well-behaved models exact, every request counted, the folded ones in ``_OTHER`` and in the job's
``folded_model`` metric."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.cardinality import folded
from infersight.schemas import pipeline as P
from infersight.stack import jobs as flink
from tests.integration.pipeline_util import prom, wait_until
from tests.support.sample_requests import sample_records

pytestmark = pytest.mark.integration

BOUND = 50
HOSTILE = 20_000
GOOD = {"llama": 1_200, "mistral": 800}
SPAN_S = 40.0
BATCH = 500
REQUESTS = P.prom(P.REQUESTS)


def new_topic(bootstrap: str, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client cancels its futures
    admin.create_topics([NewTopic(name, 3, 1)])[name].result(30)
    return name


def records(tag: str, end_s: float) -> tuple[list[dict], dict[str, int]]:
    """This test's records, sorted by end: the well-behaved models over the whole span, the hostile names (each
    once) from 2 s into it; every record with the model version ``v-<tag>`` (what tells this test's series from
    others'). The good models' counts by name."""
    start_ns = int((end_s - SPAN_S) * 1e9)
    version = f"v-{tag}"
    good = [dataclasses.replace(r, model_version=version)
            for i, (model, n) in enumerate(GOOD.items())
            for r in sample_records(n, start_ns, SPAN_S, seed=11 + i, models=(f"{model}-{tag}",))]
    hostile = [dataclasses.replace(r, model=f"hostile-{tag}-{i}", model_version=version)
               for i, r in enumerate(sample_records(HOSTILE, start_ns + 2 * 10**9, SPAN_S - 2, seed=13))]
    out = sorted(good + hostile, key=lambda r: r.end_ns)
    first_hostile = next(i for i, r in enumerate(out) if r.model.startswith("hostile-"))
    assert {r.model for r in out[:first_hostile]} == {f"{m}-{tag}" for m in GOOD}  # the good ones came first
    return [r.to_dict() for r in out], {f"{m}-{tag}": n for m, n in GOOD.items()}


def produce(bootstrap: str, topic: str, rows: list[dict]) -> None:
    """In batches as normalize writes them (a JSON array, the Kafka timestamp its latest end), on one partition:
    in order, so the bound admits the names as they come."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for lo in range(0, len(rows), BATCH):
        batch = rows[lo:lo + BATCH]
        producer.produce(topic, json.dumps(batch).encode(), key=b"gw",
                         timestamp=max(r["end_ns"] for r in batch) // 1_000_000)
    assert producer.flush(60) == 0


def test_a_flood_of_model_names_is_folded_the_good_models_stay_exact_and_every_request_counts(stack):
    lay = stack.layout
    bootstrap = lay.kafka_bootstrap
    tag = uuid.uuid4().hex[:6]
    rows, good = records(tag, time.time() - 60)  # ending a minute ago: the last windows close on silence
    requests_topic, pods_topic, stats_topic = (new_topic(bootstrap, f"test-cardinality-{kind}-{tag}")
                                               for kind in ("requests", "pods", "window-stats"))
    produce(bootstrap, requests_topic, rows)

    job = flink.submit(lay, "infersight.flink_jobs.metrics.job",
                       ["--brokers", bootstrap, "--group-id", f"test-cardinality-{tag}", "--requests-topic",
                        requests_topic, "--pods-topic", pods_topic, "--window-stats-topic", stats_topic,
                        "--max-label-values", f"{P.LABEL_MODEL}={BOUND}"])
    try:
        selector = f'{REQUESTS}{{{P.LABEL_MODEL_VERSION}="v-{tag}",{P.LABEL_REGION}!="{P.GLOBAL_REGION}"}}'

        def by_model() -> Counter:
            return Counter({s["metric"][P.LABEL_MODEL]: int(float(s["value"][1])) for s in prom(
                lay.prometheus_url, f"sum by ({P.LABEL_MODEL}) (last_over_time({selector}[30m]))")})

        def seen() -> str:
            counts = by_model()
            return (f"{len(counts)} model values, {sum(counts.values())} of {len(rows)} requests, good "
                    f"{ {m: counts.get(m) for m in good} }, {P.OVERFLOW_VALUE} {counts.get(P.OVERFLOW_VALUE)}")

        # the last windows close on silence (the quiet watermark: a minute), then a checkpoint commits them
        counts = wait_until(lambda: (lambda c: c if sum(c.values()) >= len(rows) else None)(by_model()), 300,
                            f"all {len(rows)} requests counted in Prometheus", last_of=seen)
        admitted = BOUND - len(good)  # the good names came first; the next 48 names hold the other places
        assert len(counts) <= BOUND + 1, seen()
        assert {m: counts[m] for m in good} == good, seen()  # the well-behaved models exact
        assert sum(counts.values()) == len(rows), seen()  # every request counted, none twice
        assert counts[P.OVERFLOW_VALUE] == HOSTILE - admitted, seen()
        assert len(counts) == BOUND + 1 and all(counts[m] == 1 for m in counts if m.startswith("hostile-")), seen()
        wait_until(lambda: folded(lay.flink_rest_url, job) == HOSTILE - admitted, 60,
                   f"the job's folded_model metric at {HOSTILE - admitted}",
                   last_of=lambda: folded(lay.flink_rest_url, job))
    finally:
        flink.stop(lay, job)
