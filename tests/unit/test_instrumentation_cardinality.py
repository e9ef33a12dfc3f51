"""Cardinality: per-label bounds on the metric label values requests supply (model, error type), folded into
``_OTHER`` past the bound within a period, counted and logged once; the in-process histogram bank's limit of
attribute sets per metric with the SDK's overflow series (``otel.metric.overflow=true``)."""

from __future__ import annotations

import inspect
import logging
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader, MetricReader
from opentelemetry.sdk.metrics.view import View
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation import selftelemetry as kinds
from infersight.instrumentation.fastmetrics import DEFAULT_CARDINALITY_LIMIT, HistogramBank, bank_for
from infersight.instrumentation.meters import HISTOGRAMS
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.records import validate
from tests.unit.fakes import FakeClock, metric_points

HOUR_MS = 3600 * 1000
READER_LIMITS = "cardinality_limits" in inspect.signature(MetricReader.__init__).parameters
VIEW_LIMITS = "aggregation_cardinality_limit" in inspect.signature(View.__init__).parameters


def make(sampler=ALWAYS_OFF, reader=None, fast_metrics=True, **settings):
    exporter = InMemorySpanExporter()
    tp = TracerProvider(sampler=sampler)
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = reader or InMemoryMetricReader()
    clock = FakeClock()
    inst = Instrumentation(tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[reader]), clock=clock,
                           gpu=False, fast_metrics=fast_metrics, settings=Settings(**settings))
    return SimpleNamespace(inst=inst, exporter=exporter, reader=reader, clock=clock)


def request(h, model, error=None, out=2):
    with h.inst.request(model) as req:
        with req.stage("queue"):
            h.clock.ms(1)
        h.clock.ms(4)
        req.first_token()
        h.clock.ms(2)
        req.token()
        req.usage(input_tokens=3, output_tokens=out)
        if error:
            req.error(error)
    return req


def durations(h) -> dict[tuple, int]:
    """Request-duration counts by (model, error type) of the points collected now."""
    return {(p.attributes.get(A.GEN_AI_REQUEST_MODEL), p.attributes.get(A.ERROR_TYPE)): p.count
            for p in metric_points(h.reader).get(M.GEN_AI_SERVER_REQUEST_DURATION, [])}


def overflow_count(h) -> int:
    return sum(p.value for p in metric_points(h.reader).get(M.INSTRUMENTATION_ERRORS, [])
               if p.attributes[A.INSTRUMENTATION_ERROR_KIND] == kinds.CARDINALITY_OVERFLOW)


def roots(h) -> dict[str, dict]:
    """The exported root spans' attributes by requested model (the last of each)."""
    return {s.attributes[A.GEN_AI_REQUEST_MODEL]: dict(s.attributes) for s in root_spans(h)}


def root_spans(h) -> list:
    return [s for s in h.exporter.get_finished_spans() if s.parent is None]


# ---- per-label bounds

@pytest.mark.parametrize("fast", [True, False], ids=["in-process-bank", "api-instruments"])
@pytest.mark.parametrize("sampler", [ALWAYS_ON, ALWAYS_OFF], ids=["sampled", "record-only"])
def test_models_past_the_bound_are_recorded_as_other_and_spans_keep_the_real_name(fast, sampler, caplog):
    h = make(sampler=sampler, fast_metrics=fast, max_models=3)
    with caplog.at_level(logging.WARNING, logger="infersight.instrumentation"):
        for model in ("a", "b", "c", "d", "e", "a", "d"):
            request(h, model)
    assert durations(h) == {("a", None): 2, ("b", None): 1, ("c", None): 1, (A.OTHER_VALUE, None): 3}
    assert overflow_count(h) == 3  # one per request whose model was folded
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # once per label
    assert "'d'" in warnings[0] and "INFERSIGHT_METRIC_MAX_MODELS" in warnings[0] and A.OTHER_VALUE in warnings[0]
    spans = roots(h)
    assert set(spans) == {"a", "b", "c", "d", "e"}  # the real names
    assert spans["d"][A.CARDINALITY_FOLDED] == (A.GEN_AI_REQUEST_MODEL,)
    assert spans["e"][A.CARDINALITY_FOLDED] == (A.GEN_AI_REQUEST_MODEL,)
    assert A.CARDINALITY_FOLDED not in spans["a"]


def test_token_usage_and_every_histogram_fold_the_same_way():
    h = make(max_models=1)
    request(h, "a", out=4)
    request(h, "b", out=6)
    points = metric_points(h.reader)
    for name in HISTOGRAMS:
        assert {p.attributes[A.GEN_AI_REQUEST_MODEL] for p in points[name]} == {"a", A.OTHER_VALUE}, name
    outputs = {p.attributes[A.GEN_AI_REQUEST_MODEL]: p.sum for p in points[M.GEN_AI_CLIENT_TOKEN_USAGE]
               if p.attributes[A.GEN_AI_TOKEN_TYPE] == "output"}
    assert outputs == {"a": 4, A.OTHER_VALUE: 6}


def test_error_types_past_the_bound_are_recorded_as_other(caplog):
    h = make(sampler=ALWAYS_ON, max_error_types=2)
    with caplog.at_level(logging.WARNING, logger="infersight.instrumentation"):
        for error in ("E1", "E2", "E3", "E1", "E4"):
            request(h, "m", error=error)
        request(h, "m")  # a success has no error type: nothing to bound
    assert durations(h) == {("m", "E1"): 2, ("m", "E2"): 1, ("m", A.OTHER_VALUE): 2, ("m", None): 1}
    assert overflow_count(h) == 2
    assert "INFERSIGHT_METRIC_MAX_ERROR_TYPES" in caplog.text
    folded = [s.attributes for s in root_spans(h) if s.attributes.get(A.CARDINALITY_FOLDED) is not None]
    assert sorted(a[A.ERROR_TYPE] for a in folded) == ["E3", "E4"]  # the span keeps the real error type
    assert all(a[A.CARDINALITY_FOLDED] == (A.ERROR_TYPE,) for a in folded)


def test_model_and_error_type_folded_together_carry_both_marks():
    h = make(sampler=ALWAYS_ON, max_models=1, max_error_types=1)
    request(h, "a", error="E1")
    request(h, "b", error="E2")
    request(h, "b", error="E1")
    assert durations(h) == {("a", "E1"): 1, (A.OTHER_VALUE, A.OTHER_VALUE): 1, (A.OTHER_VALUE, "E1"): 1}
    marks = [s.attributes.get(A.CARDINALITY_FOLDED) for s in root_spans(h)]
    assert marks == [None, (A.GEN_AI_REQUEST_MODEL, A.ERROR_TYPE), (A.GEN_AI_REQUEST_MODEL,)]
    assert overflow_count(h) == 3


def test_records_keep_the_real_values():
    records = []
    h = make(max_models=1)
    h.inst.on_record = records.append
    request(h, "a")
    request(h, "b")
    assert [r.model for r in records] == ["a", "b"] and all(validate(r) == [] for r in records)


def test_a_new_period_admits_values_again():
    h = make(max_models=2, cardinality_period_s=3600)
    for model in ("a", "b", "c"):
        request(h, model)
    assert durations(h)[(A.OTHER_VALUE, None)] == 1
    h.clock.ms(HOUR_MS)
    request(h, "c")  # the first new value after the period's end starts the next one: admitted
    request(h, "d")
    request(h, "a")  # admitted in the last period, not yet in this one: full
    assert h.inst._bounds.admitted(A.GEN_AI_REQUEST_MODEL) == {"c", "d"}
    assert durations(h) == {("a", None): 1, ("b", None): 1, ("c", None): 1, ("d", None): 1,
                            (A.OTHER_VALUE, None): 2}
    request(h, "d")  # cached from this period: no change
    h.clock.ms(HOUR_MS)
    request(h, "a")
    assert durations(h)[("a", None)] == 2 and overflow_count(h) == 2


def test_an_admitted_value_costs_one_dict_lookup(monkeypatch):
    h = make(max_models=2)
    request(h, "a")
    calls = []
    admit = h.inst._bounds.admit
    monkeypatch.setattr(h.inst._bounds, "admit", lambda *args: calls.append(args) or admit(*args))
    for _ in range(5):
        request(h, "a")
    assert calls == []  # the series cache answers: the bounds are not consulted
    request(h, "b")
    request(h, "c")  # folded: not cached, so a later period is seen
    request(h, "c")
    assert [args[1] for args in calls] == ["b", "c", "c"]


def test_the_first_request_of_a_folded_model_after_a_period_is_admitted_without_a_new_value():
    h = make(max_models=1)
    request(h, "a")
    request(h, "b")
    h.clock.ms(HOUR_MS)
    request(h, "b")  # folded keys are never cached: it meets the period's end itself
    assert durations(h)[("b", None)] == 1


# ---- settings

def test_settings_from_environment_and_defaults(caplog):
    default = Settings()
    assert (default.max_models, default.max_error_types, default.cardinality_period_s) == (100, 50, 3600.0)
    s = Settings.from_env({"INFERSIGHT_METRIC_MAX_MODELS": "7", "INFERSIGHT_METRIC_MAX_ERROR_TYPES": "9",
                           "INFERSIGHT_METRIC_CARDINALITY_PERIOD_S": "600"})
    assert (s.max_models, s.max_error_types, s.cardinality_period_s) == (7, 9, 600.0)
    with caplog.at_level(logging.WARNING, logger="infersight.instrumentation"):
        bad = Settings.from_env({"INFERSIGHT_METRIC_MAX_MODELS": "many", "INFERSIGHT_METRIC_MAX_ERROR_TYPES": "0",
                                 "INFERSIGHT_METRIC_CARDINALITY_PERIOD_S": "inf"})
    assert (bad.max_models, bad.max_error_types, bad.cardinality_period_s) == (100, 50, 3600.0)
    assert caplog.text.count("using") == 3
    for wrong in ({"max_models": 0}, {"max_error_types": 2.5}, {"cardinality_period_s": 0}):
        with pytest.raises(ValueError, match="positive"):
            Settings(**wrong)


# ---- the bank's limit of attribute sets per metric (the SDK's overflow series)

def bank_points(reader, name=M.GEN_AI_SERVER_REQUEST_DURATION) -> list:
    return metric_points(reader)[name]


def test_the_bank_keeps_at_most_the_limit_and_one_overflow_series(caplog):
    bank = HistogramBank(HISTOGRAMS, "s", "1", {M.GEN_AI_SERVER_REQUEST_DURATION: 3})
    name = M.GEN_AI_SERVER_REQUEST_DURATION
    with caplog.at_level(logging.WARNING, logger="infersight.instrumentation"):
        handles = [bank.series(name, i, {"k": i}) for i in range(10)]
        bank.record_series([(handle, 1.0) for handle in handles])
    assert len(bank._series) == 4  # three sets and the overflow series: no key past the limit is kept
    reader = SimpleNamespace()
    (metric,) = bank.collect(reader)
    points = {tuple(p.attributes.items()): p.count for p in metric.data.data_points}
    assert points == {(("k", 0),): 1, (("k", 1),): 1, (("k", 2),): 1, ((A.OTEL_METRIC_OVERFLOW, True),): 7}
    assert caplog.text.count("cardinality limit") == 1
    # other metrics have their own limit (the SDK's default)
    assert bank.limits[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN] == DEFAULT_CARDINALITY_LIMIT == 2000


def test_the_default_limit_is_the_sdks_2000_per_metric():
    h = make(max_models=5000)
    for i in range(2100):
        request(h, f"model-{i}")
    points = bank_points(h.reader)
    assert len(points) == 2001
    (overflow,) = [p for p in points if A.OTEL_METRIC_OVERFLOW in p.attributes]
    assert dict(overflow.attributes) == {A.OTEL_METRIC_OVERFLOW: True} and overflow.count == 100
    assert sum(p.count for p in points) == 2100


@pytest.mark.skipif(not READER_LIMITS, reason="this SDK's readers take no cardinality limits")
def test_the_bank_takes_the_readers_histogram_limit():
    reader = InMemoryMetricReader(cardinality_limits={Histogram: 4})
    h = make(reader=reader, max_models=100)
    for i in range(10):
        request(h, f"m{i}")
    points = bank_points(reader)
    assert len(points) == 5 and sum(p.count for p in points) == 10
    assert [dict(p.attributes) for p in points if A.OTEL_METRIC_OVERFLOW in p.attributes] == [
        {A.OTEL_METRIC_OVERFLOW: True}]


@pytest.mark.skipif(not VIEW_LIMITS, reason="this SDK's views take no cardinality limit")
def test_the_bank_takes_a_views_limit_for_the_histograms_it_selects():
    view = View(instrument_name=M.GEN_AI_SERVER_REQUEST_DURATION, aggregation_cardinality_limit=2)
    other = View(instrument_name="someone.elses.histogram", aggregation_cardinality_limit=1)
    bank = bank_for(MeterProvider(metric_readers=[InMemoryMetricReader()], views=[view, other]), HISTOGRAMS,
                    A.SCOPE_NAME, A.SCOPE_VERSION)
    assert bank is not None
    assert bank.limits[M.GEN_AI_SERVER_REQUEST_DURATION] == 2
    assert bank.limits[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN] == DEFAULT_CARDINALITY_LIMIT


def test_a_delta_reader_gets_the_overflow_series_too():
    reader = InMemoryMetricReader(preferred_temporality={Histogram: AggregationTemporality.DELTA})
    h = make(reader=reader, max_models=100)
    h.inst._histograms.limits[M.GEN_AI_SERVER_REQUEST_DURATION] = 2
    for model in ("a", "b", "c", "d"):
        request(h, model)
    first = {tuple(p.attributes.items()): p.count for p in bank_points(reader)}
    assert first[((A.OTEL_METRIC_OVERFLOW, True),)] == 2 and len(first) == 3
    request(h, "d")
    second = {tuple(p.attributes.items()): p.count for p in bank_points(reader)}
    assert second == {((A.OTEL_METRIC_OVERFLOW, True),): 1}
