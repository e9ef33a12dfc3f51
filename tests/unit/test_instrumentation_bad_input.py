"""Bad input never raises into serving code: it is counted by kind, logged once per kind, and the
request still completes with its metrics."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation import selftelemetry as kinds
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.records import validate
from tests.unit.fakes import FakeClock


def make(**kwargs):
    exporter = InMemorySpanExporter()
    tp = kwargs.pop("tracer_provider", None) or TracerProvider()
    if isinstance(tp, TracerProvider):
        tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    clock = FakeClock()
    inst = Instrumentation(tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[reader]), clock=clock,
                           gpu=False, settings=Settings(), **kwargs)
    return SimpleNamespace(inst=inst, exporter=exporter, reader=reader, clock=clock)


def counts(reader) -> tuple[dict[str, int], dict[str, int]]:
    """(errors by kind, request-duration count by metric)"""
    errors: dict[str, int] = {}
    requests: dict[str, int] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    if metric.name == M.INSTRUMENTATION_ERRORS:
                        errors[point.attributes[A.INSTRUMENTATION_ERROR_KIND]] = point.value
                    elif metric.name == M.GEN_AI_SERVER_REQUEST_DURATION:
                        requests[metric.name] = requests.get(metric.name, 0) + point.count
    return errors, requests


CASES = {
    "usage_wrong_type": (kinds.BAD_TYPE, lambda req, h: req.usage(input_tokens="many")),
    "usage_negative": (kinds.NEGATIVE_VALUE, lambda req, h: req.usage(output_tokens=-3)),
    "prefix_cache_hits_over_queries": (kinds.NEGATIVE_VALUE, lambda req, h: req.prefix_cache(4, 9)),
    "token_before_first_token": (kinds.TOKEN_BEFORE_FIRST_TOKEN, lambda req, h: (req.token(), req.first_token())),
    "end_stage_not_open": (kinds.STAGE_NOT_OPEN, lambda req, h: req.end_stage("decode")),
    "stage_left_open": (kinds.STAGE_LEFT_OPEN, lambda req, h: req.stage("prefill")),
    "unknown_stage": (kinds.UNKNOWN_STAGE, lambda req, h: req.stage("warmup").end()),
    "bad_verdict": (kinds.UNKNOWN_VALUE, lambda req, h: req.safety("input").verdict("maybe")),
    "bad_sample_rate": (kinds.UNKNOWN_VALUE, lambda req, h: req.evaluation("relevance", 0.5, sample_rate=0)),
    "bad_finish_reason": (kinds.UNKNOWN_VALUE, lambda req, h: req.finish("bored")),
    "bad_error_value": (kinds.BAD_TYPE, lambda req, h: req.error(42)),
    "double_finish": (kinds.DOUBLE_FINISH, lambda req, h: (req.finish(), req.finish())),
    "double_start": (kinds.DOUBLE_START, lambda req, h: req.start()),
    "mark_tokens_not_numbers": (kinds.BAD_TYPE, lambda req, h: (req.first_token(), req.mark_tokens(["a", "b"]))),
    "mark_tokens_out_of_order": (kinds.NEGATIVE_DURATION,
                                 lambda req, h: (req.first_token(), req.mark_tokens([h.clock.now + 9, h.clock.now]))),
    "mark_tokens_after_finish": (kinds.AFTER_FINISH, lambda req, h: (req.finish(), req.mark_tokens([h.clock.now]))),
    "unhashable_verdict": (kinds.UNKNOWN_VALUE, lambda req, h: req.safety("input").verdict(["pass"])),
    "unhashable_stage_name": (kinds.BAD_TYPE, lambda req, h: req.stage(["queue"]).end()),
    "stage_name_not_a_string": (kinds.BAD_TYPE, lambda req, h: req.stage(0.0, k=1).end()),
    "unknown_stage_with_a_lone_surrogate": (kinds.UNKNOWN_STAGE, lambda req, h: req.stage("warm\ud800").end()),
    "unhashable_attribute_key": (kinds.BAD_TYPE, lambda req, h: req.stage("queue").set_attribute(["k"], 1)),
    "attribute_key_not_a_string": (kinds.BAD_TYPE, lambda req, h: req.stage("queue").set_attribute(5, 1)),
    "evaluation_score_not_a_number": (kinds.BAD_TYPE, lambda req, h: req.evaluation("relevance", "high")),
    "evaluation_score_a_list": (kinds.BAD_TYPE, lambda req, h: req.evaluation("relevance", [0.5])),
    "evaluation_score_too_big": (kinds.BAD_TYPE, lambda req, h: req.evaluation("relevance", 10**400)),
    "error_type_with_a_lone_surrogate": (kinds.BAD_TYPE, lambda req, h: req.error("boom\udfff")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_counted_not_raised_and_the_request_completes(case):
    kind, misuse = CASES[case]
    h = make()
    with h.inst.request("llama") as req:
        h.clock.ms(1)
        misuse(req, h)
        h.clock.ms(1)
    errors, requests = counts(h.reader)
    assert errors.get(kind) == 1, errors
    assert requests[M.GEN_AI_SERVER_REQUEST_DURATION] == 1
    assert validate(req.record()) == []


def _encoded_by_both(exporter) -> list:
    """The exported spans through our OTLP encoder and the SDK's (each raises on a span it cannot write)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans

    from infersight.instrumentation.otlp_encoder import encode_spans

    spans = exporter.get_finished_spans()
    sdk_encode_spans(spans).SerializeToString()
    encode_spans(spans)
    return spans


@pytest.mark.parametrize("sampled", [True, False])
def test_bad_request_labels_are_counted_and_replaced_and_the_request_is_recorded(sampled):
    """A model or error type UTF-8 cannot write (a lone surrogate) and an operation that is not a string (here
    unhashable): each counted as bad_type, per request; the request keeps its metrics, spans and record, with
    U+FFFD for the surrogates and the default operation."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    h = make(tracer_provider=TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF))
    for _ in range(2):
        with h.inst.request("llama\ud800", operation={"name": "chat"}) as req:
            with req.stage("queue"):
                h.clock.ms(1)
            req.error("boom\udfff")
            req.finish("error")
    errors, requests = counts(h.reader)
    assert errors == {kinds.BAD_TYPE: 2 * 3}, errors
    assert requests[M.GEN_AI_SERVER_REQUEST_DURATION] == 2
    spans = _encoded_by_both(h.exporter)
    root = next(s for s in spans if s.parent is None or s.name.startswith("chat"))
    assert root.name == "chat llama\ufffd"
    assert root.attributes[A.GEN_AI_REQUEST_MODEL] == "llama\ufffd" and root.attributes[A.ERROR_TYPE] == "boom\ufffd"
    assert root.attributes[A.GEN_AI_OPERATION_NAME] == "chat"
    assert len(spans) == (4 if sampled else 2)
    record = req.record()
    assert validate(record) == [] and record.model == "llama\ufffd" and record.error_type == "boom\ufffd"
    data = h.reader.get_metrics_data()
    models = {point.attributes.get(A.GEN_AI_REQUEST_MODEL) for rm in data.resource_metrics for sm in rm.scope_metrics
              for m in sm.metrics if m.name == M.GEN_AI_SERVER_REQUEST_DURATION for point in m.data.data_points}
    assert models == {"llama\ufffd"}


def test_odd_stage_names_make_spans_both_encoders_write():
    h = make()
    with h.inst.request("llama") as req:
        req.stage(0.0).end()
        req.stage(["queue"], k=1).end()
        with req.stage("warm\ud800") as stage:
            stage.set_attribute("k", 1)
    names = sorted(s.name for s in _encoded_by_both(h.exporter))
    assert names == ["0.0", "['queue']", "chat llama", "warm\ufffd"]
    errors, _ = counts(h.reader)
    assert errors == {kinds.BAD_TYPE: 2, kinds.UNKNOWN_STAGE: 1}


def test_finish_and_tokens_without_start():
    h = make()
    req = h.inst.request("llama")
    req.first_token()
    req.finish()
    errors, requests = counts(h.reader)
    assert errors[kinds.NOT_STARTED] == 2
    assert requests == {}  # nothing was started, so nothing is recorded
    assert req.record() is None


def test_token_marked_before_start_is_dropped():
    h = make()
    req = h.inst.request("llama")
    req.token()
    h.clock.ms(5)
    with req:
        h.clock.ms(10)
        req.first_token()
    errors, _ = counts(h.reader)
    assert errors[kinds.TOKEN_OUTSIDE_REQUEST] == 1
    assert req.record().ttft_s == pytest.approx(0.010)


def test_token_before_first_token_uses_the_earliest_mark():
    h = make()
    with h.inst.request("llama") as req:
        h.clock.ms(10)
        req.token()
        h.clock.ms(10)
        req.first_token()
        h.clock.ms(10)
        req.token()
    record = req.record()
    assert record.ttft_s == pytest.approx(0.010)
    assert record.itl_count == 2


def test_negative_stage_duration_is_clamped_and_counted():
    h = make()
    with h.inst.request("llama") as req:
        stage = req.stage("queue")
        stage.start_ns = h.clock.now - 10_000_000_000  # a start before the request (bad caller timestamps)
        stage.end()
    errors, _ = counts(h.reader)
    assert errors[kinds.NEGATIVE_DURATION] == 1
    assert req.record().queue_s >= 0


def test_wrong_model_type_is_counted():
    h = make()
    with h.inst.request(None):
        pass
    errors, requests = counts(h.reader)
    assert errors[kinds.BAD_TYPE] == 1 and requests[M.GEN_AI_SERVER_REQUEST_DURATION] == 1


def test_a_model_whose_str_raises_is_recorded_as_unknown():
    class Model:
        def __str__(self):
            raise RuntimeError("no")

        def __repr__(self):
            return "Model()"

    h = make()
    with h.inst.request(Model()) as req:
        pass
    errors, requests = counts(h.reader)
    assert errors == {kinds.BAD_TYPE: 1} and requests[M.GEN_AI_SERVER_REQUEST_DURATION] == 1
    assert req.record().model == "unknown"


def test_malformed_traceparent_starts_a_new_trace():
    h = make()
    with h.inst.request("llama", headers={"traceparent": "garbage"}) as req:
        pass
    assert req.record().trace_id != "0" * 32


def test_each_kind_is_logged_once(caplog):
    h = make()
    with caplog.at_level(logging.WARNING, logger="infersight.instrumentation"):
        for _ in range(5):
            with h.inst.request("llama") as req:
                req.usage(input_tokens="x")
                req.usage(output_tokens=-1)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert any(kinds.BAD_TYPE in m for m in messages) and any(kinds.NEGATIVE_VALUE in m for m in messages)
    errors, _ = counts(h.reader)
    assert errors == {kinds.BAD_TYPE: 5, kinds.NEGATIVE_VALUE: 5}


class ExplodingProvider:
    def get_tracer(self, *args, **kwargs):
        raise RuntimeError("tracer backend down")


def test_a_broken_tracer_never_breaks_the_request():
    h = make(tracer_provider=ExplodingProvider())
    with h.inst.request("llama") as req:
        req.first_token()
    errors, requests = counts(h.reader)
    assert errors[kinds.INTERNAL] >= 1
    assert requests[M.GEN_AI_SERVER_REQUEST_DURATION] == 1


def test_a_failing_record_sink_is_counted():
    def sink(record):
        raise ValueError("queue full")

    h = make(on_record=sink)
    with h.inst.request("llama"):
        pass
    errors, requests = counts(h.reader)
    assert errors[kinds.INTERNAL] == 1 and requests[M.GEN_AI_SERVER_REQUEST_DURATION] == 1


def test_mark_tokens_gives_the_same_figures_as_token_calls():
    """An engine's own token times, given at once, summarise exactly as the same marks made live; out of
    order they are counted and put in order."""
    gaps_ms = (3, 1, 4, 1, 5, 9, 2, 6)
    records = []
    for way in ("live", "at_once", "shuffled"):
        h = make()
        with h.inst.request("llama") as req:
            h.clock.ms(20)
            req.first_token()
            times = []
            for gap in gaps_ms:
                h.clock.ms(gap)
                if way == "live":
                    req.token()
                times.append(h.clock.now)
            if way == "at_once":
                req.mark_tokens(times)
            elif way == "shuffled":
                req.mark_tokens(times[4:])
                req.mark_tokens(times[:4])
        records.append(req.record())
        errors, _ = counts(h.reader)
        assert errors.get(kinds.NEGATIVE_DURATION, 0) == (1 if way == "shuffled" else 0)
    live, at_once, shuffled = records
    assert live.itl_count == len(gaps_ms) and live.itl_max_s == pytest.approx(0.009)
    fields = ("itl_count", "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_mean_s", "ttft_s", "tokens_out")
    for other in (at_once, shuffled):
        assert [getattr(other, f) for f in fields] == [getattr(live, f) for f in fields]
