"""The canary job on the real stack (Kafka, Flink with the Kafka connector, the sink, Prometheus): the
simulator's canary regression, as request records on Kafka, turns the verdict on the compacted
``infersight.rollout.verdicts`` topic to ``fail`` (keyed by rollout), the verdict gauge reaches Prometheus, the
stack's verdict service answers ``fail``, a verdict service with a webhook POSTs it once and logs the final
verdict as an MLflow run, and a poison message goes to the dead-letter topic while the job keeps judging."""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
import uuid

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from infersight.demo import WebhookInbox
from infersight.flink_jobs.canary.stream import JOB
from infersight.schemas import canary as C
from infersight.schemas.quality import RELEVANCE
from infersight.schemas.records import dump_batch
from infersight.schemas.topics import DLQ, ROLLOUT_VERDICTS
from infersight.stack import jobs as flink
from infersight.stack.verdict_service import serve
from tests.integration.pipeline_util import prom_value, read_all, wait_until
from tests.support.canary_traffic import NS, batch_end_ns, canary_records

pytestmark = pytest.mark.integration


def verdicts(bootstrap: str, model: str) -> list[tuple[str, dict]]:
    out = []
    for m in read_all(bootstrap, ROLLOUT_VERDICTS.name):
        event = json.loads(m.value())
        if event["model"] == model:
            out.append((m.key().decode(), event))
    return out


def get_json(url: str) -> dict:
    """The service's answer; {} while it has no verdict for the path (404)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise


def test_a_canary_regression_fails_on_the_verdicts_topic_and_in_prometheus(stack, tmp_path):
    lay = stack.layout
    bootstrap = lay.kafka_bootstrap
    # a second verdict service, ready before the fail exists (fails read back at start are not announced)
    inbox = WebhookInbox()
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    server, stop, service = serve(bootstrap, "127.0.0.1", 0, webhook_url=inbox.url, mlflow_tracking_uri=store,
                                  mlflow_experiment="test-canary")
    wait_until(lambda: service.ready, 60, "the verdict service to read the topic")
    tag = uuid.uuid4().hex[:6]
    model = f"llama-{tag}"
    topic, results_topic = f"test-requests-{tag}", f"test-evaluations-{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client cancels its futures
    for name in (topic, results_topic):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)

    start_ns = time.time_ns() - 150 * NS  # 120 s of traffic ending half a minute ago
    batches = canary_records(model, start_ns, 120)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    producer.produce(topic, b"{not json", timestamp=start_ns // 1_000_000)
    rng = random.Random(7)
    for batch in batches:
        producer.produce(topic, dump_batch(batch).encode(), timestamp=batch_end_ns(batch) // 1_000_000)
        # a judged tenth of the requests: relevance scores alike on both sides, so the latency regression is
        # what fails the canary (infersight.evaluations' records)
        results = [{"trace_id": r["trace_id"], "span_id": "1" * 16, "time_ns": r["end_ns"] + 20_000_000,
                    "region": r["region"], "name": RELEVANCE, "sample_rate": 0.1, "label": None, "model": model,
                    "model_version": r["model_version"], "track": r["track"],
                    "score": rng.betavariate(8, 2)}
                   for r in batch if rng.random() < 0.1]
        if results:
            producer.produce(results_topic, dump_batch(results).encode(),
                             timestamp=max(x["time_ns"] for x in results) // 1_000_000)
    assert producer.flush(60) == 0

    job = flink.submit(lay, "infersight.flink_jobs.canary.job",
                       ["--brokers", bootstrap, "--group-id", f"test-canary-{tag}", "--input-topic", topic,
                        "--evaluations-topic", results_topic,
                        "--bake-s", "240", "--interval-s", "15", "--quiet-s", "30", "--idle-s", "30",
                        "--checkpoint-s", "2"], timeout_s=420)  # the client builds a table env too: slow when busy
    try:
        got = wait_until(lambda: (lambda v: v if any(e["verdict"] == "fail" for _, e in v) else None)(
            verdicts(bootstrap, model)), 240, "a fail verdict of the canary",
            last_of=lambda: [e["verdict"] for _, e in verdicts(bootstrap, model)][-3:])
        failed = [(k, e) for k, e in got if e["verdict"] == "fail"]
        key, event = failed[0]
        region = batches[0][0]["region"]
        assert key == C.rollout_id(model, event["canary_version"], event["region"]) == event["rollout"]
        assert event["final"] and event["region"] in (region, C.ALL_REGIONS_LABEL)
        assert any(m["metric"] in ("ttft_s", "e2e_s", "error_ratio") and m["status"] == "fail"
                   for m in event["metrics"])
        assert event["elapsed_s"] <= 120  # early: within the traffic, before the 240 s bake's end
        quality = next(m for m in event["metrics"] if m["metric"] == "quality_score")
        assert quality["n_canary"] > 0 and quality["n_stable"] > 0  # the judges' results reached the bake
        assert quality["status"] != "fail"
        query = f'max_over_time({C.PROM_VERDICT}{{model="{model}"}}[30m])'
        wait_until(lambda: prom_value(lay.prometheus_url, query) == C.VERDICT_CODE["fail"], 90,
                   "the fail verdict's gauge in Prometheus")
        letters = [json.loads(m.value()) for m in read_all(bootstrap, DLQ.name)]
        assert any(d["job"] == JOB and d["reason"] == "not_json" for d in letters)
        config = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, ROLLOUT_VERDICTS.name)])
        (described,) = config.values()
        assert described.result()["cleanup.policy"].value == "compact"  # one verdict per rollout kept
        # what Argo Rollouts' Web provider reads: the stack's own verdict service
        path = f"/verdicts/{model}/{event['canary_version']}?region={event['region']}"
        answer = wait_until(lambda: (lambda a: a if a.get("verdict") == "fail" else None)(
            get_json(lay.verdicts_url + path)), 60, f"the stack's verdict service to answer fail on {path}")
        assert answer["rollout"] == key
        wait_until(lambda: key in [m["rollout"] for m in inbox.received], 30, "the webhook's POST of the fail")
        assert [m["rollout"] for m in inbox.received].count(key) == 1
        from infersight.stack.verdict_mlflow import MlflowVerdicts  # the mlflow extra

        final = next(e for _, e in got if e["final"])
        mlflow = MlflowVerdicts(store, "test-canary")
        run_id = wait_until(lambda: mlflow.run_of(final), 120, "the final verdict's MLflow run")
        assert mlflow.client.get_run(run_id).data.tags["verdict"] == final["verdict"]
    finally:
        flink.stop(lay, job)
        stop.set()
        server.shutdown()
        inbox.close()
