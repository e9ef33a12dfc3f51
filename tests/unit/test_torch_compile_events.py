"""torch.compile adapter with real torch on CPU (backend "eager": real Dynamo capture, guards, recompiles
and graph breaks, without inductor's C++ build)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch._dynamo.utils as dynamo_utils
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, set_span_in_context

from infersight.instrumentation.torch_compile import (
    TorchCompileInstrumentor,
    event_from_metrics,
    instrument_module,
)
from infersight.schemas import torch_compile as N


@pytest.fixture
def otel():
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    mp = MeterProvider(metric_readers=[reader])
    events: list = []
    inst = TorchCompileInstrumentor()
    inst.instrument(tracer_provider=tp, meter_provider=mp, compile_hook=events.append)
    torch._dynamo.reset()
    try:
        yield tp, mp, exporter, reader, events
    finally:
        inst.uninstrument()
        torch._dynamo.reset()


def _points(reader, name):
    data = reader.get_metrics_data()
    return [p for rm in (data.resource_metrics if data else []) for sm in rm.scope_metrics for m in sm.metrics
            if m.name == name for p in m.data.data_points]


def breaks_once(x, n):
    y = x.sin()
    print("graph break here")  # noqa: T201 - Dynamo cannot trace print: one graph break
    return y * n


def test_compile_recompile_and_graph_breaks(otel, capsys):
    tp, _, exporter, reader, events = otel
    fn = torch.compile(breaks_once, backend="eager")
    with tp.get_tracer("t").start_as_current_span("request") as request:
        fn(torch.randn(4), 3)
    fn(torch.randn(4), 3)          # same guards: no compile
    fn(torch.randn(2, 3), 3)       # rank change: recompile with a reason
    compiles = [e for e in events if e.frame == "breaks_once"]
    assert [e.kind for e in compiles] == ["compile", "recompile"]
    assert compiles[1].compile_id == "0/1"
    assert "rank mismatch" in compiles[1].recompile_reason
    assert all(e.duration_s > 0 for e in events)
    assert sum(e.graph_breaks for e in events) >= 1
    assert any("builtin operator" in r for e in events for r in e.graph_break_reasons)

    spans = [s for s in exporter.get_finished_spans() if s.name == "torch.compile breaks_once"]
    assert len(spans) == 2
    first, second = spans
    assert first.parent.span_id == request.get_span_context().span_id  # the request that compiled
    assert first.attributes[N.COMPILE_KIND] == "compile" and first.attributes[N.COMPILE_ID] == "0/0"
    assert "rank mismatch" in second.attributes[N.RECOMPILE_REASON]
    assert second.end_time - second.start_time == pytest.approx(compiles[1].duration_s * 1e9, rel=1e-3)

    kinds = {dict(p.attributes)[N.COMPILE_KIND]: p.count for p in _points(reader, N.COMPILE_DURATION)}
    assert kinds["compile"] >= 2 and kinds["recompile"] >= 2  # the frame and its resume function, each
    assert sum(p.value for p in _points(reader, N.GRAPH_BREAK_COUNT)) == sum(e.graph_breaks for e in events)


def test_instrumented_module_latency_and_spans_only_when_sampled(otel):
    tp, mp, exporter, reader, _ = otel
    lin = torch.nn.Linear(8, 8)
    model = instrument_module(torch.compile(lin, backend="eager"), "decoder", tracer_provider=tp,
                              meter_provider=mp)
    x = torch.randn(2, 8)
    model(x)                                   # compiles during the call; no parent span: no span
    not_sampled = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    from opentelemetry import context

    token = context.attach(set_span_in_context(NonRecordingSpan(not_sampled)))
    try:
        model(x)                               # parent not sampled: no span
    finally:
        context.detach(token)
    with tp.get_tracer("t").start_as_current_span("request"):
        model(x)                               # sampled: one span
    assert model.calls == 3
    assert model.in_features == 8              # attribute access passes through
    call_spans = [s for s in exporter.get_finished_spans() if s.name == "torch.compile.call decoder"]
    assert len(call_spans) == 1
    by_flag = {dict(p.attributes)[N.COMPILED_DURING_CALL]: p for p in _points(reader, N.CALL_DURATION)}
    assert by_flag[True].count == 1 and by_flag[False].count == 2
    assert by_flag[True].sum > by_flag[False].sum / 2  # the compiling call is the slow one
    assert dict(by_flag[False].attributes)[N.MODULE] == "decoder"


def test_errors_in_the_module_propagate_and_are_counted(otel):
    tp, mp, _, reader, _ = otel

    def boom(x):
        raise ValueError("bad shape")

    model = instrument_module(boom, "broken", tracer_provider=tp, meter_provider=mp)
    with pytest.raises(ValueError, match="bad shape"):
        model(1)
    (point,) = _points(reader, N.CALL_DURATION)
    assert dict(point.attributes)["error.type"] == "ValueError"


def test_uninstrument_restores_torch_and_instrument_is_idempotent():
    original = dynamo_utils.log_compilation_event
    assert not hasattr(original, "__wrapped__")
    inst = TorchCompileInstrumentor()
    inst.instrument()
    inst.instrument()
    assert dynamo_utils.log_compilation_event.__wrapped__ is original
    inst.uninstrument()
    assert dynamo_utils.log_compilation_event is original


class _Metrics:
    def __init__(self, **kw):
        self.__dict__.update(kw)


@pytest.mark.parametrize("record", [
    _Metrics(), _Metrics(is_runtime=True, start_time_us=1, duration_us=1),
    _Metrics(start_time_us="x", duration_us=5), _Metrics(start_time_us=10, duration_us=-5), object(),
])
def test_malformed_compile_records_are_skipped(record):
    assert event_from_metrics(record) is None


def test_compile_record_mapping():
    event = event_from_metrics(_Metrics(compile_id="3/2", co_name="fwd", start_time_us=1_000, end_time_us=3_000,
                                        recompile_reason=None, fail_type="Unsupported", fail_reason="nope",
                                        graph_op_count=7), ("a", "a"))
    assert (event.kind, event.frame, event.start_ns, event.duration_s) == ("recompile", "fwd", 1_000_000, 0.002)
    assert (event.graph_breaks, event.fail_type, event.graph_ops) == (2, "Unsupported", 7)
