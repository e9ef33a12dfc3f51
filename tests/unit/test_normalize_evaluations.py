"""Evaluation records from real instrumentation output: spans made by ``Instrumentation`` and the evaluation
worker, encoded by the OTLP exporter's own encoder, decoded by normalize's extraction; bad results named."""

from __future__ import annotations

import time

import pytest
from google.protobuf.message import DecodeError
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.flink_jobs.normalize.evaluations import evaluations_from_payload
from infersight.instrumentation import Instrumentation, Settings
from infersight.schemas.evaluation import validate


def _run(evaluate) -> list:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"cloud.region": "eu-west-1"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    inst = Instrumentation(tracer_provider=tp, gpu=False,
                           settings=Settings(region="eu-west-1", track="canary", model_version="v7"))
    with inst.request("llama") as req:
        evaluate(req, before=True)
    evaluate(req, before=False)
    payload = encode_spans(exporter.get_finished_spans()).SerializeToString()
    return list(evaluations_from_payload(payload)), exporter.get_finished_spans()


def test_early_and_late_results_join_the_request_span():
    def evaluate(req, before):
        if before:
            req.evaluation("guardrail.pii", 0.0, "clear", sample_rate=0.1)
        else:
            req.evaluation("relevance", 0.75, sample_rate=0.01)
    out, spans = _run(evaluate)
    root = next(s for s in spans if s.name != "gen_ai.evaluation")
    assert len(out) == 2 and all(isinstance(r, dict) for r in out)
    by_name = {r["name"]: r for r in out}
    for r in out:
        assert r["trace_id"] == format(root.context.trace_id, "032x")
        assert r["span_id"] == format(root.context.span_id, "016x")  # the late one: its parent's id
        assert r["region"] == "eu-west-1" and not validate(r)
        # both carry the request's series: the root span's attributes, or the late span's copy of them
        assert (r["model"], r["model_version"], r["track"]) == ("llama", "v7", "canary")
    assert by_name["relevance"]["score"] == 0.75 and by_name["relevance"]["sample_rate"] == 0.01
    early = by_name["guardrail.pii"]
    assert early["model"] == "llama" and early["label"] == "clear" and early["sample_rate"] == 0.1


def test_out_of_range_score_is_a_problem_naming_the_field():
    def evaluate(req, before):
        if not before:
            req.evaluation("relevance", 7.5, sample_rate=0.5)
    out, _ = _run(evaluate)
    [(trace_id, problems)] = out
    assert len(trace_id) == 32 and problems == ["score 7.5 must be a number in [0, 1] or absent"]


@pytest.mark.parametrize("field,value,starts", [
    ("sample_rate", 0.0, "sample_rate"), ("sample_rate", None, "sample_rate"), ("name", "", "name"),
    ("span_id", "0" * 16, "span_id"), ("trace_id", "xyz", "trace_id"), ("score", float("nan"), "score")])
def test_validate_names_each_bad_field(field, value, starts):
    rec = {"trace_id": "a" * 32, "span_id": "b" * 16, "time_ns": 1, "region": "r", "name": "relevance",
           "sample_rate": 0.01, "score": 0.5}
    assert not validate(rec)
    [problem] = validate({**rec, field: value})
    assert problem.startswith(starts)


def test_bytes_that_are_not_otlp_raise_decode_error():
    with pytest.raises(DecodeError):
        list(evaluations_from_payload(b"\xff\xff not otlp"))


def _payload(evaluate) -> bytes:
    exporter = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource.create({"cloud.region": "eu-west-1"}))
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    inst = Instrumentation(tracer_provider=tp, gpu=False, settings=Settings(region="eu-west-1"))
    with inst.request("llama") as req:
        req.usage(input_tokens=5, output_tokens=0)
    evaluate(req)
    return encode_spans(exporter.get_finished_spans()).SerializeToString()


def test_normalize_writes_evaluations_beside_the_request_records_and_bad_ones_to_the_dlq():
    import json

    from infersight.flink_jobs.normalize.core import normalize
    from infersight.schemas.records import parse_batch
    from infersight.schemas.topics import DLQ, EVALUATIONS, OTLP_REQUESTS, REQUESTS

    def good_and_bad(req):
        req.evaluation("relevance", 0.6, sample_rate=0.01)
        req.evaluation("relevance", -3.0, sample_rate=0.01)

    out = list(normalize(OTLP_REQUESTS.name, 0, 7, _payload(good_and_bad), time.time_ns()))
    by_topic = {}
    for topic, value, _ts in out:
        by_topic.setdefault(topic, []).append(value)
    assert len(parse_batch(by_topic[REQUESTS.name][0])) == 1
    [evals] = [parse_batch(v) for v in by_topic[EVALUATIONS.name]]
    assert [(e["name"], e["score"], e["sample_rate"]) for e in evals] == [("relevance", 0.6, 0.01)]
    [letter] = [json.loads(v) for v in by_topic[DLQ.name]]
    assert letter["reason"].startswith("evaluation score -3.0") and letter["source"]["offset"] == 7


def test_a_payload_without_evaluations_is_not_decoded_twice():
    from infersight.flink_jobs.normalize.evaluations import evaluation_outputs

    payload = _payload(lambda req: None)
    assert list(evaluation_outputs(payload, lambda *a: "", 0)) == []
    assert list(evaluation_outputs(b"garbage without the marker", lambda *a: "", 0)) == []


def test_a_result_far_from_the_clock_is_a_dead_letter_like_a_request():
    from infersight.flink_jobs.normalize.evaluations import evaluation_outputs
    from infersight.schemas.topics import DLQ

    payload = _payload(lambda req: req.evaluation("relevance", 0.5, sample_rate=0.5))
    far_future_now = time.time_ns() + 3 * 86_400 * 10**9  # the results are three days old for this clock
    [(topic, letter, _ts)] = list(evaluation_outputs(payload, lambda reason, p, t: reason, far_future_now))
    assert topic == DLQ.name and letter.startswith("evaluation time_ns:") and "in the past" in letter
