"""Evaluators beside serving: guardrail checks, tolerant judge-score parsing, the sampler, and the worker's
bounded queue (overflow drops and counts, never blocks; results are gen_ai.evaluation.result events of the
request's trace with the sample rate; explanations only with content capture, through the redaction hook)."""

from __future__ import annotations

import random
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation.evaluation.base import Result, Sample, load_plugins
from infersight.instrumentation.evaluation.guardrails import Guardrails, pii_found
from infersight.instrumentation.evaluation.llm_judge import LLMJudge, parse_rating
from infersight.instrumentation.evaluation.worker import EvaluationWorker, Sampler
from infersight.schemas import attributes as A
from infersight.schemas.metrics import GEN_AI_EVALUATION_RESULT
from infersight.schemas.quality import EMPTY_OR_TRUNCATED, LANGUAGE_MISMATCH, PII, REFUSAL


@pytest.mark.parametrize("text,kinds", [
    ("write to jane.doe@example.org today", ["email"]),
    ("card 4111 1111 1111 1111 expires soon", ["card"]),
    ("card 4111 1111 1111 1112 is a typo", []),  # fails the Luhn check: not a card (nor a phone: 16 digits)
    ("IBAN DE89 3704 0044 0532 0130 00 please", ["iban"]),
    ("IBAN DE89 3704 0044 0532 0130 01 please", []),  # fails mod-97
    ("call +44 20 7946 0958 now", ["phone"]),
    ("the answer is 42 and 1999 was a year", []),
])
def test_pii_kinds(text, kinds):
    assert pii_found(text) == kinds


def _flags(sample: Sample) -> dict[str, float | None]:
    return {r.name: r.score for r in Guardrails().evaluate(sample)}


def test_guardrails_flag_refusal_truncation_and_language():
    q = "How do I reset my router to factory settings?"
    assert _flags(Sample("m", q, "I'm sorry, but I can't help with that request."))[REFUSAL] == 1.0
    assert _flags(Sample("m", q, "Hold the reset button for ten seconds until the lights blink."))[REFUSAL] == 0.0
    assert _flags(Sample("m", q, "Hold the reset", finish_reason="length"))[EMPTY_OR_TRUNCATED] == 1.0
    assert _flags(Sample("m", q, "   "))[EMPTY_OR_TRUNCATED] == 1.0
    de = "Halten Sie die Reset-Taste zehn Sekunden lang gedrückt, bis die Lichter blinken."
    assert _flags(Sample("m", q, de))[LANGUAGE_MISMATCH] == 1.0
    en = "Hold the reset button for ten seconds until all the lights on the front blink."
    out = _flags(Sample("m", q, en))
    assert out[LANGUAGE_MISMATCH] == 0.0 and out[PII] == 0.0


@pytest.mark.parametrize("reply,score", [
    ("Score: 4\nThe answer is on topic.", 0.75),
    ("**Rating:** 5 - fully addresses it", 1.0),
    ("I'd give it 2/5 because it drifts.", 0.25),
    ("3 out of 5", 0.5),
    ("1. The answer ignores the question.", 0.0),
    ("The answer is fine, I would say 4.", 0.75),
    ("No idea.", None),
    ("Score: 9", None),
])
def test_judge_rating_parsing_tolerates_real_output(reply, score):
    assert parse_rating(reply) == score


def test_unknown_rubric_is_refused():
    with pytest.raises(ValueError, match="unknown rubric"):
        LLMJudge("http://127.0.0.1:1/v1", "judge", rubrics=("politeness",))


def test_sampler_rates_per_model_and_bad_rate_refused():
    s = Sampler(default=0.0, rates={"big": 1.0, "mid": 0.25}, rng=random.Random(1))
    assert s.draw("other") is None and s.draw("big") == 1.0
    hits = sum(s.draw("mid") is not None for _ in range(20_000))
    assert 0.23 < hits / 20_000 < 0.27
    with pytest.raises(ValueError, match="sample rate of big"):
        Sampler(rates={"big": 1.5})


class _Slow:
    name = "slow"

    def __init__(self) -> None:
        self.release = threading.Event()

    def evaluate(self, sample: Sample):
        self.release.wait(10)
        return (Result("relevance", 0.9, "relevant", f"quoted: {sample.answer}"),)


class _Broken:
    name = "broken"

    def evaluate(self, sample: Sample):
        raise RuntimeError("boom")


def _instrumentation() -> tuple[Instrumentation, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return Instrumentation(tracer_provider=tp, gpu=False, settings=Settings(region="eu-west-1")), exporter


def test_full_queue_drops_and_counts_without_blocking():
    slow = _Slow()
    worker = EvaluationWorker([slow], Sampler(default=1.0), max_queue=2)
    inst, _ = _instrumentation()
    t = time.perf_counter()
    queued = []
    for _ in range(50):
        with inst.request("m") as req:
            pass
        queued.append(worker.submit(req, Sample("m", "q", "a")))
    elapsed = time.perf_counter() - t
    slow.release.set()
    worker.close()
    # one in the worker's hands, two in the queue; the rest dropped, and submit never waited for the evaluator
    assert sum(queued) <= 3 and worker.counters.dropped_queue_full == 50 - sum(queued)
    assert elapsed < 2.0


def test_results_are_evaluation_events_of_the_request_trace_with_the_rate():
    inst, exporter = _instrumentation()
    slow = _Slow()
    slow.release.set()
    worker = EvaluationWorker([slow, _Broken()], Sampler(default=1.0), capture_content=False)
    with inst.request("m") as req:
        pass
    assert worker.submit(req, Sample("m", "question", "secret answer"))
    worker.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    (root,) = [s for s in spans.values() if s.name != "gen_ai.evaluation"]
    late = spans["gen_ai.evaluation"]
    assert late.context.trace_id == root.context.trace_id and late.parent.span_id == root.context.span_id
    (event,) = [e for e in late.events if e.name == GEN_AI_EVALUATION_RESULT]
    assert event.attributes[A.GEN_AI_EVALUATION_SCORE_VALUE] == 0.9
    assert event.attributes[A.EVALUATION_SAMPLE_RATE] == 1.0
    assert A.GEN_AI_EVALUATION_EXPLANATION not in event.attributes  # content capture is off
    assert worker.counters.evaluator_errors == 1 and worker.counters.results == 1


def test_explanations_go_through_the_redaction_hook_with_capture_on():
    inst, exporter = _instrumentation()
    slow = _Slow()
    slow.release.set()
    worker = EvaluationWorker([slow], Sampler(default=1.0), capture_content=True,
                              redact=lambda s: s.replace("secret", "[REDACTED]"))
    with inst.request("m") as req:
        pass
    worker.submit(req, Sample("m", "question", "secret answer"))
    worker.close()
    (late,) = [s for s in exporter.get_finished_spans() if s.name == "gen_ai.evaluation"]
    assert late.events[0].attributes[A.GEN_AI_EVALUATION_EXPLANATION] == "quoted: [REDACTED] answer"


def test_no_plugins_registered_is_an_empty_list():
    assert load_plugins("infersight.evaluators.none-registered") == []


def test_a_sampled_out_trace_still_exports_its_late_result_record_only():
    """The judge's rate is the estimate's weight: a trace sampler that dropped the trace must not drop the
    result too (the gateway keeps record-only spans out of full traces, in the requests topic)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=ALWAYS_OFF)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    inst = Instrumentation(tracer_provider=tp, gpu=False, settings=Settings(region="eu-west-1"))
    slow = _Slow()
    slow.release.set()
    worker = EvaluationWorker([slow], Sampler(default=1.0))
    with inst.request("m") as req:
        pass
    worker.submit(req, Sample("m", "q", "a"))
    worker.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    root = next(s for n, s in spans.items() if n != "gen_ai.evaluation")
    late = spans["gen_ai.evaluation"]
    assert root.attributes[A.RECORD_ONLY] and late.attributes[A.RECORD_ONLY]
    assert late.parent.span_id == root.context.span_id and late.context.trace_id == root.context.trace_id
    assert late.events[0].attributes[A.EVALUATION_SAMPLE_RATE] == 1.0
