"""Evaluation results through the real pipeline (issue #17): a serving process's instrumentation and evaluation
worker (real guardrails) export over OTLP to a regional gateway; the gateway keeps the late results'
``gen_ai.evaluation`` spans in ``infersight.otlp.requests``, also for a trace the sampler dropped; the normalize
job writes them as evaluation records on ``infersight.evaluations``, keyed to their request, with the sample
rate, the gateway's region and the request's series; the quality job turns them into quality records on
``infersight.quality`` (the sampling-weighted mean) and metrics in Prometheus, and dead-letters malformed
evaluation and quality-signals messages while it keeps running. Both jobs start at the module's start
(``--start-ms``): the session's topics hold every earlier module's traffic."""

from __future__ import annotations

import hashlib
import json
import time
import uuid

import pytest
from confluent_kafka import Producer
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from infersight.flink_jobs.quality.stream import JOB as QUALITY_JOB
from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation.evaluation.base import Sample
from infersight.instrumentation.evaluation.guardrails import Guardrails
from infersight.instrumentation.evaluation.worker import EvaluationWorker, Sampler
from infersight.schemas import pipeline as P
from infersight.schemas.quality import PII, REFUSAL, RELEVANCE
from infersight.schemas.topics import DLQ, EVALUATIONS, QUALITY, QUALITY_SIGNALS
from infersight.stack import jobs as flink
from tests.integration.pipeline_util import prom_value, read_all, request_records, since_now_ms, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def jobs(stack):
    """normalize and the quality job (10 s windows; 30 s of silence close the last ones), from now on."""
    lay, tag = stack.layout, uuid.uuid4().hex[:8]
    start = ["--brokers", lay.kafka_bootstrap, "--start-ms", str(since_now_ms())]
    ids = {"normalize": flink.submit(lay, "infersight.flink_jobs.normalize.job",
                                     [*start, "--group-id", f"test-eval-{tag}"])}
    try:
        ids["quality"] = flink.submit(lay, "infersight.flink_jobs.quality.job",
                                      [*start, "--group-id", f"test-quality-{tag}", "--window-s", "10",
                                       "--quiet-s", "30", "--idle-s", "5", "--checkpoint-s", "2"],
                                      timeout_s=420)  # the client builds a table env too: slow when busy
        wait_until(lambda: all(flink.tasks_running(lay, j) for j in ids.values()), 120, "the jobs to run")
        yield ids
    finally:
        for job in ids.values():
            try:
                flink.stop(lay, job, timeout_s=180)
            except OSError:
                pass


@pytest.fixture(scope="module")
def normalize(jobs):
    return jobs["normalize"]


def _serve(endpoint: str, sampler, model: str) -> tuple[str, str]:
    """One request served, then judged by the real guardrails in the worker (judge sample rate 1); returns the
    request's (trace id, span id)."""
    provider = TracerProvider(sampler=sampler, resource=Resource.create({"service.name": "eval-test"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    inst = Instrumentation(tracer_provider=provider, gpu=False,
                           settings=Settings(region="ignored", track="canary", model_version="v3"))
    judge = EvaluationWorker([Guardrails()], Sampler(default=1.0))
    with inst.request(model) as req:
        req.usage(input_tokens=12, output_tokens=0)
    rec = req.record()  # the request's ids, on which its evaluation records join
    judge.submit(req, Sample(model, "Where can I reach the support team?",
                             "Write to support@example.com, I'm sorry, but I can't share a phone number."))
    judge.close()
    provider.shutdown()
    return rec.trace_id, rec.span_id


@pytest.mark.parametrize("sampler", [ALWAYS_ON, ALWAYS_OFF], ids=["sampled", "sampled-out"])
def test_late_results_become_evaluation_records(stack, normalize, sampler):
    region = stack.layout.regions[0]
    model = f"eval-{uuid.uuid4().hex[:6]}"
    trace_id, span_id = _serve(stack.layout.otlp_endpoint(region), sampler, model)

    def ours():
        recs = [r for r in request_records(stack.layout.kafka_bootstrap, EVALUATIONS.name)
                if r.get("trace_id") == trace_id]
        return recs if len(recs) == 4 else None

    recs = wait_until(ours, 120, f"the four guardrail results of trace {trace_id} on {EVALUATIONS.name}")
    by_name = {r["name"]: r for r in recs}
    assert by_name[PII]["score"] == 1.0 and by_name[REFUSAL]["score"] == 1.0
    for r in recs:
        assert r["span_id"] == span_id and r["sample_rate"] == 1.0
        assert (r["region"], r["model"], r["model_version"], r["track"]) == (region, model, "v3", "canary")


def _serve_judged(endpoint: str, model: str, results: list[tuple[float, float]]) -> None:
    """One request per (score, sample rate), each judged for relevance before it finished (the result is an event
    on its span)."""
    provider = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create({"service.name": "quality-test"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    inst = Instrumentation(tracer_provider=provider, gpu=False,
                           settings=Settings(region="ignored", track="canary", model_version="v3"))
    for score, rate in results:
        with inst.request(model) as req:
            req.usage(input_tokens=20, output_tokens=8)
            req.evaluation(RELEVANCE, score, sample_rate=rate)
    provider.shutdown()


def test_the_quality_job_weights_results_by_their_sample_rate_into_kafka_and_prometheus(stack, jobs):
    lay = stack.layout
    bootstrap, region, tag = lay.kafka_bootstrap, lay.regions[0], uuid.uuid4().hex[:6]
    model = f"quality-{tag}"
    # poison on the job's input: a message that is not JSON, and a record with an impossible sample rate
    poison, bad_trace = f"{{not json {tag}".encode(), uuid.uuid4().hex
    bad = [{"trace_id": bad_trace, "span_id": "c" * 16, "time_ns": time.time_ns(), "region": region,
            "name": RELEVANCE, "sample_rate": 0.0, "score": 0.5, "model": model}]
    # and on its other input, the metrics job's signals: a message that is not JSON, a record with no requests
    signals_poison = f"[{{signals {tag}".encode()
    bad_signals = {"window_end_ms": 10_000, "window_ms": 10_000, "region": region, "model": model,
                   "model_version": "v3", "track": "canary", "engine": "vllm", "requests": 0, "signals": {}}
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(EVALUATIONS.name, poison)
    producer.produce(EVALUATIONS.name, json.dumps(bad).encode())
    producer.produce(QUALITY_SIGNALS.name, signals_poison)
    producer.produce(QUALITY_SIGNALS.name, json.dumps(bad_signals).encode())
    assert producer.flush(30) == 0

    results = [(0.9, 1.0), (0.2, 0.1), (0.6, 0.5), (0.7, 0.25), (0.4, 0.2)]  # (relevance score, sample rate)
    _serve_judged(lay.otlp_endpoint(region), model, results)
    expected = sum(y / p for y, p in results) / sum(1 / p for _, p in results)  # 0.405, the plain mean 0.56

    def ours():
        found = []
        for m in read_all(bootstrap, QUALITY.name):
            rec = json.loads(m.value())
            if rec.get("model") == model and rec.get("type") == "quality" and RELEVANCE in rec["evaluators"]:
                found.append((m.key().decode(), rec))
        return found if sum(r["evaluators"][RELEVANCE]["samples"] for _, r in found) == len(results) else None

    found = wait_until(ours, 150, f"the quality records of {model} on {QUALITY.name}")
    assert {key for key, _ in found} == {f"{region}|{model}|v3|canary"}
    windows = [r["evaluators"][RELEVANCE] for _, r in found]  # one window, or two if the requests straddled one
    weighted = sum(w["mean"] * w["weighted_requests"] for w in windows) / sum(w["weighted_requests"] for w in windows)
    assert weighted == pytest.approx(expected, rel=1e-9)
    assert sum(w["weighted_requests"] for w in windows) == pytest.approx(sum(1 / p for _, p in results))

    query = f'max_over_time({P.prom(P.QUALITY_SCORE)}{{model="{model}",evaluator="{RELEVANCE}"}}[30m])'
    got = wait_until(lambda: prom_value(lay.prometheus_url, query), 60, "the weighted score in Prometheus")
    assert got == pytest.approx(max(w["mean"] for w in windows), rel=1e-9)

    letters = [json.loads(m.value()) for m in read_all(bootstrap, DLQ.name)]
    ours_dead = [d for d in letters if d["job"] == QUALITY_JOB]
    assert any(d["trace_id"] == bad_trace and "sample_rate" in d["reason"] for d in ours_dead)
    assert any(d["raw_sha256"] == hashlib.sha256(poison).hexdigest() and d["reason"].startswith("payload")
               for d in ours_dead)
    from_signals = [d for d in ours_dead if d["source"]["topic"] == QUALITY_SIGNALS.name]
    assert any(d["raw_sha256"] == hashlib.sha256(signals_poison).hexdigest() and d["reason"].startswith("payload")
               for d in from_signals)
    bad_sha = hashlib.sha256(json.dumps(bad_signals, separators=(",", ":")).encode()).hexdigest()
    assert any(d["raw_sha256"] == bad_sha and "requests" in d["reason"] for d in from_signals)
    assert flink.tasks_running(lay, jobs["quality"])  # bad input never stops the job
