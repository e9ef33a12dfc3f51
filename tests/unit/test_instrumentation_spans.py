"""The generic API's traces: span tree, timings from an injected clock, propagation, async, content."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, TraceFlags

from infersight.instrumentation import Instrumentation, Settings
from infersight.schemas import attributes as A
from infersight.schemas.metrics import GEN_AI_EVALUATION_RESULT, SAFETY_CHECK_EVENT
from infersight.schemas.records import validate
from tests.unit.fakes import FakeClock

WALL0 = 1_700_000_000_000_000_000
PARENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT_SPAN = "b7ad6b7169203331"


class Harness:
    def __init__(self, sampler=ALWAYS_ON, tracer_provider=None, **kwargs) -> None:
        self.exporter = InMemorySpanExporter()
        self.tp = TracerProvider(sampler=sampler)
        self.tp.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.mp = MeterProvider(metric_readers=[self.reader])
        self.clock = FakeClock(5_000_000_000)
        self.records: list = []
        kwargs.setdefault("settings", Settings(region="eu-west-1", track="canary", model_version="v7"))
        self.inst = Instrumentation(tracer_provider=tracer_provider or self.tp, meter_provider=self.mp,
                                    clock=self.clock, wall_clock=lambda: WALL0 + self.clock.now, gpu=False,
                                    on_record=self.records.append, **kwargs)

    def spans(self) -> dict:
        return {s.name: s for s in self.exporter.get_finished_spans()}


def run_request(h: Harness, gaps_ms=(10, 10, 10, 50, 10), **request_kwargs):
    """queue 10 ms, safety 2 ms, prefill 20 ms, first token, then tokens after the given gaps."""
    with h.inst.request("llama", **request_kwargs) as req:
        with req.stage("routing"):
            h.clock.ms(1)
        with req.stage("queue"):
            h.clock.ms(10)
        with req.safety("input", check="pii") as guard:
            h.clock.ms(2)
            guard.verdict("pass", check="pii")
            guard.verdict("flag", check="toxicity")
            guard.verdict("pass", check="jailbreak")
        with req.stage("prefill"):
            h.clock.ms(20)
        with req.stage("decode"):
            req.first_token()
            for gap in gaps_ms:
                h.clock.ms(gap)
                req.token()
        h.clock.ms(3)
        req.usage(input_tokens=40, cached_tokens=32)
        req.finish("length")
    return req


def test_span_tree_names_kinds_and_parents():
    h = Harness()
    run_request(h)
    spans = h.spans()
    assert set(spans) == {"chat llama", "routing", "queue", "safety", "prefill", "decode"}
    root = spans["chat llama"]
    assert root.kind is SpanKind.SERVER and root.parent is None
    for name in ("routing", "queue", "safety", "prefill", "decode"):
        stage = spans[name]
        assert stage.parent.span_id == root.context.span_id
        assert stage.context.trace_id == root.context.trace_id
        assert stage.attributes[A.STAGE] == name
    assert spans["queue"].start_time == WALL0 + 5_000_000_000 + 1_000_000
    assert spans["queue"].end_time - spans["queue"].start_time == 10_000_000
    assert root.end_time - root.start_time == 126_000_000  # 33 + 90 + 3 ms
    assert root.resource.attributes is not None and root.instrumentation_scope.name == "infersight.instrumentation"


def test_root_attributes_and_latency_summary_from_known_timings():
    h = Harness()
    req = run_request(h)
    attrs = h.spans()["chat llama"].attributes
    assert attrs[A.GEN_AI_REQUEST_MODEL] == "llama" and attrs[A.GEN_AI_OPERATION_NAME] == "chat"
    assert attrs[A.DEPLOYMENT_TRACK] == "canary" and attrs[A.MODEL_VERSION] == "v7"
    assert attrs[A.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert attrs[A.TTFT] == pytest.approx(0.033)           # 1 + 10 + 2 + 20 ms
    assert attrs[A.E2E] == pytest.approx(0.126)
    assert attrs[A.QUEUE_DURATION] == pytest.approx(0.010)
    assert attrs[A.PREFILL_DURATION] == pytest.approx(0.020)
    assert attrs[A.ITL_COUNT] == 5
    assert attrs[A.ITL_MEAN] == pytest.approx(0.018)
    assert attrs[A.TPOT] == pytest.approx(0.018)
    assert attrs[A.ITL_P50] == pytest.approx(0.010)
    assert attrs[A.ITL_P90] == pytest.approx(0.050)
    assert attrs[A.ITL_P99] == pytest.approx(0.050)
    assert attrs[A.ITL_MAX] == pytest.approx(0.050)
    assert attrs[A.GEN_AI_USAGE_INPUT_TOKENS] == 40 and attrs[A.GEN_AI_USAGE_OUTPUT_TOKENS] == 6
    assert attrs[A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 32
    record = req.record()
    assert h.records == [record]
    assert validate(record) == []
    assert (record.ttft_s, record.itl_p90_s, record.tokens_out, record.track) == (
        pytest.approx(0.033), pytest.approx(0.05), 6, "canary")
    assert record.region == "eu-west-1"
    assert record.end_ns - record.start_ns == 126_000_000


def test_percentiles_are_nearest_rank_over_many_tokens():
    h = Harness()
    gaps = [10] * 98 + [200, 400]  # 100 gaps: p99 is the 99th smallest
    run_request(h, gaps_ms=gaps)
    attrs = h.spans()["chat llama"].attributes
    assert attrs[A.ITL_COUNT] == 100
    assert attrs[A.ITL_P90] == pytest.approx(0.010)
    assert attrs[A.ITL_P99] == pytest.approx(0.200)
    assert attrs[A.ITL_MAX] == pytest.approx(0.400)


def test_safety_stage_keeps_the_most_severe_verdict_and_one_event_per_check():
    h = Harness()
    run_request(h)
    safety = h.spans()["safety"]
    assert safety.attributes[A.SAFETY_DIRECTION] == "input"
    assert safety.attributes[A.SAFETY_VERDICT] == "flag"
    events = [e for e in safety.events if e.name == SAFETY_CHECK_EVENT]
    assert [e.attributes[A.SAFETY_CHECK] for e in events] == ["pii", "toxicity", "jailbreak"]


def test_exception_marks_error_and_propagates():
    h = Harness()
    with pytest.raises(TimeoutError):
        with h.inst.request("llama") as req:
            with req.stage("prefill"):
                raise TimeoutError("engine timed out")
    spans = h.spans()
    root = spans["chat llama"]
    assert root.attributes[A.ERROR_TYPE] == "TimeoutError"
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes[A.GEN_AI_RESPONSE_FINISH_REASONS] == ("error",)
    assert spans["prefill"].attributes[A.ERROR_TYPE] == "TimeoutError"
    assert h.records[0].error_type == "TimeoutError" and validate(h.records[0]) == []


def test_trace_context_in_and_out():
    h = Harness()
    header = {"traceparent": f"00-{PARENT_TRACE}-{PARENT_SPAN}-01"}
    out: dict[str, str] = {}
    user_tracer = h.tp.get_tracer("user.code")
    with h.inst.request("llama", headers=header) as req:
        with req.stage("routing"):
            with user_tracer.start_as_current_span("pick-replica"):
                pass
        req.inject(out)
        req.finish()
    spans = h.spans()
    root = spans["chat llama"]
    assert format(root.context.trace_id, "032x") == PARENT_TRACE
    assert format(root.parent.span_id, "016x") == PARENT_SPAN and root.parent.is_remote
    assert out["traceparent"] == f"00-{PARENT_TRACE}-{root.context.span_id:016x}-01"
    assert spans["pick-replica"].parent.span_id == spans["routing"].context.span_id


def test_sampled_out_request_propagates_not_sampled_and_exports_only_its_record_only_root():
    h = Harness(sampler=ALWAYS_OFF)
    out: dict[str, str] = {}
    with h.inst.request("llama") as req:
        with req.stage("queue"):
            h.clock.ms(5)
        req.first_token()
        req.inject(out)
        req.finish()
    [root] = h.exporter.get_finished_spans()  # no stage span: the trace is not sampled
    assert root.name == "chat llama" and root.attributes[A.RECORD_ONLY] is True
    assert root.attributes[A.QUEUE_DURATION] == pytest.approx(0.005)
    assert out["traceparent"].endswith("-00")  # downstream services still see "not sampled"
    assert req.sampled is False
    assert out["traceparent"].split("-")[1] == h.records[0].trace_id == format(root.context.trace_id, "032x")
    # the record-only root's context is the propagated one with the sampled flag, built as the API builds it
    propagated = trace.get_current_span(req.context).get_span_context()
    assert root.context == SpanContext(propagated.trace_id, propagated.span_id, is_remote=False,
                                       trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=propagated.trace_state)
    assert root.context.is_valid and not propagated.trace_flags.sampled


def test_request_records_can_be_turned_off():
    h = Harness(sampler=ALWAYS_OFF, settings=Settings(request_records=False))
    with h.inst.request("llama") as req:
        req.finish()
    assert h.exporter.get_finished_spans() == ()


def test_async_variant():
    h = Harness()

    async def serve() -> None:
        async with h.inst.request("llama", operation="text_completion") as req:
            with req.stage("queue"):
                await asyncio.sleep(0)
                h.clock.ms(4)
            req.first_token()
            for _ in range(3):
                await asyncio.sleep(0)
                h.clock.ms(7)
                req.token()

    asyncio.run(serve())
    root = h.spans()["text_completion llama"]
    assert root.attributes[A.TTFT] == pytest.approx(0.004)
    assert root.attributes[A.ITL_COUNT] == 3 and root.attributes[A.ITL_MEAN] == pytest.approx(0.007)
    assert h.spans()["queue"].parent.span_id == root.context.span_id


def test_no_content_recorded_by_default():
    h = Harness()
    with h.inst.request("llama") as req:
        req.prompt("my card is 4111 1111 1111 1111")
        req.completion("ok")
    attrs = h.spans()["chat llama"].attributes
    assert A.GEN_AI_INPUT_MESSAGES not in attrs and A.GEN_AI_OUTPUT_MESSAGES not in attrs


def test_redaction_hook_runs_before_content_is_recorded():
    calls = []

    def redact(text: str) -> str:
        calls.append(text)
        return text.replace("4111 1111 1111 1111", "[CARD]")

    h = Harness(capture_content=True, redact=redact)
    with h.inst.request("llama") as req:
        req.prompt("my card is 4111 1111 1111 1111")
        req.completion("noted 4111 1111 1111 1111")
    attrs = h.spans()["chat llama"].attributes
    assert "[CARD]" in attrs[A.GEN_AI_INPUT_MESSAGES] and "4111" not in attrs[A.GEN_AI_INPUT_MESSAGES]
    assert "4111" not in attrs[A.GEN_AI_OUTPUT_MESSAGES]
    assert len(calls) == 2


def test_failing_redaction_drops_the_text():
    def redact(text: str) -> str:
        raise RuntimeError("redactor down")

    h = Harness(capture_content=True, redact=redact)
    with h.inst.request("llama") as req:
        req.prompt("secret")
    assert A.GEN_AI_INPUT_MESSAGES not in h.spans()["chat llama"].attributes


def test_evaluation_event_with_sample_rate_and_late_evaluation_child_span():
    h = Harness()
    with h.inst.request("llama") as req:
        req.evaluation("relevance", score_value=0.8, score_label="relevant", sample_rate=0.05)
    req.evaluation("faithfulness", score_value=0.2, sample_rate=0.5)  # judge answered after finish
    spans = h.spans()
    (event,) = [e for e in spans["chat llama"].events if e.name == GEN_AI_EVALUATION_RESULT]
    assert event.attributes[A.GEN_AI_EVALUATION_NAME] == "relevance"
    assert event.attributes[A.GEN_AI_EVALUATION_SCORE_VALUE] == 0.8
    assert event.attributes[A.GEN_AI_EVALUATION_SCORE_LABEL] == "relevant"
    assert event.attributes[A.EVALUATION_SAMPLE_RATE] == 0.05
    late = spans["gen_ai.evaluation"]
    assert late.parent.span_id == spans["chat llama"].context.span_id
    assert late.events[0].attributes[A.GEN_AI_EVALUATION_NAME] == "faithfulness"


class _NotTheSdkProvider:
    """A tracer provider that is not the SDK's: the plain API path must be used."""

    def __init__(self, inner: TracerProvider) -> None:
        self.inner = inner

    def get_tracer(self, *args, **kwargs):
        return self.inner.get_tracer(*args, **kwargs)


def test_plain_api_path_for_other_tracer_providers():
    h = Harness()
    h2 = Harness(tracer_provider=_NotTheSdkProvider(h.tp))
    run_request(h2)
    spans = h.spans()  # h2 exports through h's provider
    assert {"chat llama", "queue", "prefill", "decode", "safety", "routing"} <= set(spans)
    root = spans["chat llama"]
    assert spans["queue"].parent.span_id == root.context.span_id
    assert root.attributes[A.ITL_COUNT] == 5
    assert spans["safety"].attributes[A.SAFETY_VERDICT] == "flag"


def test_per_token_marks_never_reach_opentelemetry():
    h = Harness()
    ended = []
    h.tp.add_span_processor(type("P", (SimpleSpanProcessor,), {"on_end": lambda self, s: ended.append(s)})(
        h.exporter))
    with h.inst.request("llama") as req:
        req.first_token()
        for _ in range(5000):
            req.token()
    assert len(ended) == 1  # the root only: no span, event or export per token
    assert ended[0].events == () or all(e.name != "token" for e in ended[0].events)
    assert ended[0].attributes[A.ITL_COUNT] == 5000


def test_region_falls_back_to_the_resource_then_unknown():
    from opentelemetry.sdk.resources import Resource

    tp = TracerProvider(resource=Resource.create({A.CLOUD_REGION: "sa-east-1"}))
    inst = Instrumentation(tracer_provider=tp, meter_provider=MeterProvider(), gpu=False, settings=Settings())
    with inst.request("llama") as req:
        pass
    assert req.record().region == "sa-east-1"
    bare = Instrumentation(tracer_provider=TracerProvider(resource=Resource.get_empty()),
                           meter_provider=MeterProvider(), gpu=False, settings=Settings())
    assert bare.region == "unknown"


def test_readable_spans_match_the_sdk():
    """The fast path builds ReadableSpan without its __init__: the pinned SDK's own constructor must set
    exactly the same fields (this fails first if an SDK upgrade adds or renames one)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace.status import Status

    from infersight.instrumentation.spans import _readable_span

    context = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent = SpanContext(1, 3, is_remote=True)
    args = dict(name="chat llama", context=context, parent=parent, resource=Resource.create({"a": 1}),
                attributes={"k": "v"}, events=[Event("e", {"x": 1}, 5)], kind=SpanKind.SERVER,
                status=Status(StatusCode.ERROR, "boom"), start_time=10, end_time=20,
                instrumentation_scope=InstrumentationScope("s", "1"))
    ours = _readable_span(ReadableSpan, args["name"], context, parent, args["resource"], args["attributes"],
                          args["events"], SpanKind.SERVER, args["status"], 10, 20, args["instrumentation_scope"])
    assert vars(ours) == vars(ReadableSpan(**args))
    assert ours.to_json() == ReadableSpan(**args).to_json()


def test_root_joins_the_current_span_and_restores_the_context():
    h = Harness()
    user_tracer = h.tp.get_tracer("user.code")
    with user_tracer.start_as_current_span("http POST") as outer:
        with h.inst.request("llama") as req:
            inside = trace.get_current_span().get_span_context()
            req.finish()
        assert trace.get_current_span() is outer
    assert trace.get_current_span() is trace.INVALID_SPAN
    root = h.spans()["chat llama"]
    assert root.parent.span_id == outer.get_span_context().span_id
    assert root.context.trace_id == outer.get_span_context().trace_id
    assert inside.span_id == root.context.span_id


def test_spans_reach_every_processor_including_one_added_later():
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import IdGenerator

    class CountingIds(IdGenerator):
        def __init__(self) -> None:
            self.n = 0

        def generate_span_id(self) -> int:
            self.n += 1
            return self.n

        def generate_trace_id(self) -> int:
            return 0xABC

    for sampler, stage_spans in ((ALWAYS_ON, 1), (ALWAYS_OFF, 0)):
        batched, simple, late = InMemorySpanExporter(), InMemorySpanExporter(), InMemorySpanExporter()
        tp = TracerProvider(sampler=sampler, id_generator=CountingIds())
        tp.add_span_processor(BatchSpanProcessor(batched))
        tp.add_span_processor(SimpleSpanProcessor(simple))
        inst = Instrumentation(tracer_provider=tp, meter_provider=MeterProvider(), gpu=False, settings=Settings())
        for i in range(2):
            if i == 1:
                tp.add_span_processor(SimpleSpanProcessor(late))
            with inst.request("llama") as req:
                with req.stage("queue"):
                    pass
                req.finish()
        tp.force_flush()
        per_request = 1 + stage_spans
        assert len(batched.get_finished_spans()) == len(simple.get_finished_spans()) == 2 * per_request
        assert len(late.get_finished_spans()) == per_request
        assert {s.context.trace_id for s in simple.get_finished_spans()} == {0xABC}  # the provider's ids
        tp.shutdown()


def test_leaving_a_request_in_another_context_does_not_raise():
    """A request entered in one context and left in another (as an async generator closed elsewhere can
    do): the ContextVar refuses the reset, the API's detach logs it, the request still finishes."""
    import contextvars

    h = Harness()
    req = h.inst.request("llama")
    contextvars.copy_context().run(req.__enter__)
    contextvars.copy_context().run(req.__exit__, None, None, None)
    assert [s.name for s in h.exporter.get_finished_spans()] == ["chat llama"]
    assert h.records and h.records[0].finish_reason == "stop"
