"""Evaluation results through the real pipeline (issue #17): a serving process's instrumentation and evaluation
worker (real guardrails) export over OTLP to a regional gateway; the gateway keeps the late results'
``gen_ai.evaluation`` spans in ``infersight.otlp.requests``, also for a trace the sampler dropped; the normalize
job writes them as evaluation records on ``infersight.evaluations``, keyed to their request, with the sample
rate, the gateway's region and the request's series."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation.evaluation.base import Sample
from infersight.instrumentation.evaluation.guardrails import Guardrails
from infersight.instrumentation.evaluation.worker import EvaluationWorker, Sampler
from infersight.schemas.quality import PII, REFUSAL
from infersight.schemas.topics import EVALUATIONS
from infersight.stack import jobs as flink
from tests.integration.pipeline_util import request_records, since_now_ms, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def normalize(stack):
    job = flink.submit(stack.layout, "infersight.flink_jobs.normalize.job",
                       ["--brokers", stack.layout.kafka_bootstrap, "--group-id", f"test-eval-{uuid.uuid4().hex[:8]}",
                        "--start-ms", str(since_now_ms())])
    wait_until(lambda: flink.tasks_running(stack.layout, job), 120, "the normalize job to run")
    yield job
    try:
        flink.stop(stack.layout, job, timeout_s=180)
    except OSError:
        pass


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
