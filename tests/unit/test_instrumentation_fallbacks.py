"""The SDK internals the instrumentation leans on for speed, each found by feature detection: present in
the installed OpenTelemetry (the fast path is taken), and, forced absent or different as in an older or
newer SDK, the public path takes over and the telemetry is the same. Runs against whatever OpenTelemetry
is installed: the pinned versions here, the oldest and newest supported in tests/compat."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import context as context_api
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from infersight.instrumentation import Instrumentation, Settings, fastmetrics, meters, spans, views
from infersight.instrumentation.meters import RequestMetrics, takes_bucket_advisory
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.registry import histogram_buckets
from tests.unit.fakes import metric_points
from tests.unit.test_instrumentation_spans import Harness, run_request

STAGE_SPANS = {"routing", "queue", "safety", "prefill", "decode"}


def _names(exported) -> set[str]:
    return {s.name for s in exported}


# ---- spans: the fast path's pieces ----

def test_the_installed_sdk_takes_the_fast_path_with_every_internal_found():
    h = Harness()
    path = h.inst.spans.current()
    assert isinstance(path, spans._FastPath)
    assert path._build is spans._readable_span  # ReadableSpan's fields are the ones we store
    var = getattr(context_api._RUNTIME_CONTEXT, "_current_context", None)
    assert spans.context_ops()[0] == var.get  # the ContextVar behind the runtime context, read directly
    bsp = BatchSpanProcessor(InMemorySpanExporter())
    shared = getattr(bsp, "_batch_processor", None)  # the shared batch processor (SDK 1.34+)
    assert spans._batch_emit(bsp) == (shared.emit if shared is not None else bsp.on_end)
    bsp.shutdown()


def test_a_batch_processor_without_the_shared_queue_gets_spans_through_on_end(monkeypatch):
    """SDKs before 1.34: BatchSpanProcessor keeps its own queue; ``on_end`` is the way in."""
    ended: list = []

    class OlderBatchSpanProcessor(SpanProcessor):
        def on_end(self, span) -> None:
            ended.append(span)

    monkeypatch.setattr("opentelemetry.sdk.trace.export.BatchSpanProcessor", OlderBatchSpanProcessor)
    h = Harness()
    h.tp.add_span_processor(OlderBatchSpanProcessor())
    assert isinstance(h.inst.spans.current(), spans._FastPath)
    run_request(h)
    assert _names(ended) == _names(h.exporter.get_finished_spans()) == STAGE_SPANS | {"chat llama"}


def test_a_readable_span_with_other_fields_is_built_by_its_constructor(monkeypatch):
    """An SDK whose ReadableSpan sets a field we do not: spans come from its constructor, complete."""

    class NewerReadableSpan(ReadableSpan):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._newer_field = "set by the constructor"

    monkeypatch.setattr("opentelemetry.sdk.trace.ReadableSpan", NewerReadableSpan)
    assert spans.readable_builder(NewerReadableSpan) is spans._readable_span_public
    h = Harness()
    assert h.inst.spans.current()._build is spans._readable_span_public
    run_request(h)
    exported = h.exporter.get_finished_spans()
    assert _names(exported) == STAGE_SPANS | {"chat llama"}
    assert all(type(s) is NewerReadableSpan and s._newer_field for s in exported)
    root = h.spans()["chat llama"]
    assert root.attributes[A.GEN_AI_REQUEST_MODEL] == "llama" and root.end_time > root.start_time
    sampled_out = Harness(sampler=ALWAYS_OFF)
    with sampled_out.inst.request("llama"):
        pass
    (record,) = sampled_out.exporter.get_finished_spans()  # the record-only root, through the constructor too
    assert record.attributes[A.RECORD_ONLY] is True and record._newer_field


def test_without_the_current_span_key_the_plain_api_path_is_used(monkeypatch):
    monkeypatch.setattr(spans, "_SPAN_KEY", None)
    h = Harness()
    assert isinstance(h.inst.spans.current(), spans._PlainPath)
    run_request(h)
    assert _names(h.exporter.get_finished_spans()) == STAGE_SPANS | {"chat llama"}
    assert h.records and h.records[0].tokens_out > 0


def test_a_provider_without_the_fields_the_fast_path_reads_gets_the_plain_path():
    class ProviderWithoutIdGenerator(TracerProvider):
        def __getattribute__(self, name):
            if name == "id_generator":
                raise AttributeError(name)
            return super().__getattribute__(name)

    # (the provider's own get_tracer needs the field, so the detection is checked directly)
    assert not spans._is_sdk(ProviderWithoutIdGenerator()) and spans._is_sdk(TracerProvider())


def test_a_runtime_context_without_a_contextvar_uses_the_api_functions(monkeypatch):
    class OtherRuntimeContext:
        pass

    monkeypatch.setattr(context_api, "_RUNTIME_CONTEXT", OtherRuntimeContext())
    assert spans.context_ops() == (context_api.get_current, context_api.attach, context_api.detach)


# ---- metrics: the in-process histogram bank and the bucket advisory ----

def _metrics_harness(**kwargs):
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader], views=[] if takes_bucket_advisory(
        MeterProvider().get_meter("probe")) else views())
    inst = Instrumentation(tracer_provider=TracerProvider(), meter_provider=mp, gpu=False,
                           settings=Settings(track="stable"), **kwargs)
    return inst, reader, mp


def _one_request(inst) -> None:
    with inst.request("llama") as req:
        req.first_token()
        req.token()
        req.usage(input_tokens=10, output_tokens=2)


def test_the_installed_sdk_bridges_the_histogram_bank():
    inst, reader, _ = _metrics_harness()
    assert isinstance(inst._histograms, fastmetrics.HistogramBank)
    _one_request(inst)
    (duration,) = metric_points(reader)[M.GEN_AI_SERVER_REQUEST_DURATION]
    assert duration.count == 1
    assert tuple(duration.explicit_bounds) == histogram_buckets(M.GEN_AI_SERVER_REQUEST_DURATION)


@pytest.mark.parametrize("missing", ["histogram class", "collect callback"])
def test_an_sdk_without_the_bank_s_internals_gets_the_api_instruments(monkeypatch, missing):
    if missing == "histogram class":
        def moved():
            raise ImportError("opentelemetry.sdk.metrics._internal.instrument has no _Histogram")

        monkeypatch.setattr(fastmetrics, "_sdk_histogram_class", moved)
        inst, reader, mp = _metrics_harness()
    else:
        reader = InMemoryMetricReader()
        mp = MeterProvider(metric_readers=[reader], views=[] if takes_bucket_advisory(
            MeterProvider().get_meter("probe")) else views())
        monkeypatch.delattr(MetricReader, "_set_collect_callback")
        inst = Instrumentation(tracer_provider=TracerProvider(), meter_provider=mp, gpu=False,
                               settings=Settings(track="stable"))
    assert fastmetrics.bank_for(mp, meters.HISTOGRAMS, "s", "1") is None
    assert isinstance(inst._histograms, RequestMetrics)
    _one_request(inst)
    (duration,) = metric_points(reader)[M.GEN_AI_SERVER_REQUEST_DURATION]
    assert duration.count == 1
    assert tuple(duration.explicit_bounds) == histogram_buckets(M.GEN_AI_SERVER_REQUEST_DURATION)


class _MeterBefore130:
    """An SDK meter seen through the API of opentelemetry-api < 1.30: ``create_histogram`` takes no advisory."""

    def __init__(self, meter) -> None:
        self._meter = meter

    def create_histogram(self, name, unit="", description=""):
        return self._meter.create_histogram(name, unit=unit, description=description)

    def __getattr__(self, name):
        return getattr(self._meter, name)


class _ProviderBefore130:
    def __init__(self, provider) -> None:
        self._provider = provider

    def get_meter(self, *args, **kwargs):
        return _MeterBefore130(self._provider.get_meter(*args, **kwargs))


def test_an_api_without_the_bucket_advisory_creates_histograms_without_it(caplog):
    reader = InMemoryMetricReader()
    sdk = MeterProvider(metric_readers=[reader], views=views())  # the buckets then come from our views
    with caplog.at_level(logging.INFO, logger="infersight.instrumentation"):
        inst = Instrumentation(tracer_provider=TracerProvider(), meter_provider=_ProviderBefore130(sdk), gpu=False,
                               settings=Settings(track="stable"))
        _one_request(inst)
        _one_request(inst)
    assert not takes_bucket_advisory(_MeterBefore130(sdk.get_meter("x")))
    assert isinstance(inst._histograms, RequestMetrics)  # not an SDK provider: the API instruments
    (itl,) = metric_points(reader)[M.ITL_P99_METRIC]
    assert itl.count == 2 and tuple(itl.explicit_bounds) == histogram_buckets(M.ITL_P99_METRIC)
    said = [r.getMessage() for r in caplog.records if "bucket advisory" in r.getMessage()]
    assert len(said) == 1 and "views()" in said[0]  # once per meter class, with the way to the buckets


def test_views_cover_every_histogram_the_instrumentation_creates():
    assert {v._instrument_name for v in views()} == set(meters.ALL_HISTOGRAMS)


# ---- zero-code activation on a pod without the instrumented library ----

def test_activation_is_quiet_about_a_library_that_is_not_installed_and_warns_about_an_unsupported_one(caplog):
    from infersight.instrumentation.activation import may_instrument

    with caplog.at_level(logging.DEBUG, logger="infersight.instrumentation.activation"):
        assert may_instrument("INFERSIGHT_TEST_UNSET_SWITCH", ("surely-not-installed-xyz >= 1",), "xyz") is False
        assert may_instrument("INFERSIGHT_TEST_UNSET_SWITCH", ("pytest >= 999",), "pytest") is False
        assert may_instrument("INFERSIGHT_TEST_UNSET_SWITCH", ("pytest >= 1",), "pytest") is True
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.WARNING]
