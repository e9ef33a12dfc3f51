"""The fast OTLP span encoder gives the very message the SDK's encoder gives, for spans of every shape, and
the exporter built on it delivers spans to a real OTLP/gRPC receiver."""

from __future__ import annotations

import logging

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace.span import TraceState

from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation.otlp import OTLPSpanExporter
from infersight.instrumentation.otlp_encoder import encode_spans
from tests.support.otlp_sink import OtlpSink

ATTRIBUTES = {"s": "text", "empty": "", "unicode": "größe ✓", "t": True, "f": False, "i": 42, "zero": 0,
              "neg": -7, "big": 2**62, "x": 0.25, "nan_free": -1e300, "strs": ("a", "b"), "ints": [1, -2, 3],
              "bools": (True, False), "floats": [0.5, 1.5], "empty_seq": ()}


def _sdk_spans() -> list:
    exporter = InMemorySpanExporter()
    resource = Resource.create({"service.name": "svc", "cloud.region": "eu-west-1", "k8s.pod.uid": 7}, "https://s/1")
    provider = TracerProvider(resource=resource, span_limits=SpanLimits(max_attributes=20, max_events=2,
                                                                         max_links=1))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("lib.a", "1.2.3", schema_url="https://schema/2",
                                 attributes={"scope.attr": "v"})
    other = provider.get_tracer("lib.b")
    remote = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED), trace_state=TraceState([("vendor", "x1")]))
    linked = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    with tracer.start_as_current_span("root", context=set_span_in_context(NonRecordingSpan(remote)),
                                      kind=SpanKind.SERVER, attributes=ATTRIBUTES,
                                      links=[Link(linked, {"link.attr": 1}), Link(linked)]) as root:
        root.add_event("first", {"e": "v", "n": 3})
        root.add_event("second")
        root.add_event("third, dropped by the limit")
        with other.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
            child.set_status(Status(StatusCode.ERROR, "boom"))
            child.set_attribute("too.many", list(range(3)))
            for i in range(25):  # over max_attributes: dropped_attributes_count
                child.set_attribute(f"a{i}", i)
        with tracer.start_as_current_span("ok", kind=SpanKind.PRODUCER) as ok:
            ok.set_status(Status(StatusCode.OK))
    with other.start_as_current_span("", kind=SpanKind.CONSUMER):  # no name, no parent
        pass
    return list(exporter.get_finished_spans())


def _sdk_encodes_scope_details() -> bool:
    """Whether the installed SDK's encoder writes a scope's attributes and schema URL, as OTLP carries them
    and ours always does (the oldest SDKs we support, 1.27 among them, leave both out)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("probe", "1", schema_url="https://schema/2", attributes={"a": "v"}).start_span("p"):
        pass
    (scope_spans,) = sdk_encode_spans(exporter.get_finished_spans()).resource_spans[0].scope_spans
    return bool(scope_spans.schema_url and scope_spans.scope.attributes)


SDK_ENCODES_SCOPE_DETAILS = _sdk_encodes_scope_details()


def _as_the_sdk_encodes(message: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """``message`` as the installed SDK's encoder would write it: without scope attributes and schema URLs
    where that encoder leaves them out (the one known difference between SDK releases)."""
    if not SDK_ENCODES_SCOPE_DETAILS:
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                scope_spans.scope.ClearField("attributes")
                scope_spans.ClearField("schema_url")
    return message


def _ours(spans) -> ExportTraceServiceRequest:
    return _as_the_sdk_encodes(ExportTraceServiceRequest.FromString(encode_spans(spans)))


def test_sdk_spans_of_every_shape_encode_to_the_sdk_encoders_message():
    spans = _sdk_spans()
    assert any(s.dropped_attributes for s in spans) and any(s.dropped_events for s in spans)
    assert any(s.dropped_links for s in spans)
    assert _ours(spans) == sdk_encode_spans(spans)


def test_our_fast_path_spans_encode_to_the_sdk_encoders_message():
    for sampler in (None, ALWAYS_OFF):  # full traces, then record-only roots
        exporter = InMemorySpanExporter()
        tp = TracerProvider(sampler=sampler) if sampler else TracerProvider()
        tp.add_span_processor(SimpleSpanProcessor(exporter))
        inst = Instrumentation(tracer_provider=tp, meter_provider=MeterProvider(), gpu=False,
                               settings=Settings(region="eu-west-1", track="canary", model_version="v3"))
        for i in range(3):
            with inst.request("llama", headers={"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"} if i else None) as req:
                with req.stage("queue"):
                    pass
                with req.safety("input", check="pii") as guard:
                    guard.verdict("flag")
                req.first_token()
                req.token()
                req.evaluation("relevance", 0.5, sample_rate=0.1)
                req.usage(input_tokens=12, output_tokens=2, cached_tokens=4)
                if i == 2:
                    req.error("TimeoutError")
                req.finish()
        spans = exporter.get_finished_spans()
        assert len(spans) >= 3
        assert _ours(spans) == sdk_encode_spans(spans)


def test_an_attribute_that_cannot_be_encoded_is_left_out_as_the_sdk_does(caplog):
    spans = _sdk_spans()
    spans[0]._attributes = {**spans[0].attributes, "huge": 2**70, "obj": object()}  # past the SDK's validation
    with caplog.at_level(logging.ERROR):
        ours = _ours(spans)
    assert ours == sdk_encode_spans(spans)
    assert "huge" not in {kv.key for kv in ours.resource_spans[0].scope_spans[0].spans[0].attributes}


def test_a_span_name_or_message_utf8_cannot_write_never_fails_the_batch():
    """Another library's span on the provider with a lone surrogate (or a non-string) for a name, event name or
    status message: written with U+FFFD (or its str), and the other spans of the batch go out as they are."""
    from opentelemetry.sdk.trace import Event

    spans = _sdk_spans()
    before = {s.span_id: s for rs in _ours(spans).resource_spans for ss in rs.scope_spans for s in ss.spans}
    first, second = spans[0], spans[1]
    first._name = "name\ud800"
    first._status = Status(StatusCode.ERROR, "bad\udfff")
    first._events = (Event("ev\ud800", {}, 5),)
    second._name = 7
    ours = ExportTraceServiceRequest.FromString(encode_spans(spans))
    after = {s.span_id: s for rs in ours.resource_spans for ss in rs.scope_spans for s in ss.spans}
    assert after.keys() == before.keys()
    one, two = (after[s.context.span_id.to_bytes(8, "big")] for s in (first, second))
    assert (one.name, one.status.message, [e.name for e in one.events]) == ("name\ufffd", "bad\ufffd", ["ev\ufffd"])
    assert two.name == "7"
    changed = {first.context.span_id.to_bytes(8, "big"), second.context.span_id.to_bytes(8, "big")}
    assert all(after[k] == before[k] for k in after.keys() - changed)


def test_exporter_delivers_to_a_real_otlp_grpc_receiver():
    sink = OtlpSink(keep=True).start()
    try:
        spans = _sdk_spans()
        exporter = OTLPSpanExporter(endpoint=sink.endpoint, insecure=True)
        assert exporter.export(spans).name == "SUCCESS"
        exporter.shutdown()
        assert sink.spans == len(spans)
        assert _as_the_sdk_encodes(sink.kept[0]) == sdk_encode_spans(spans)
    finally:
        sink.stop()


def test_exporter_is_what_the_vllm_plugin_builds_and_an_otel_traces_exporter_choice():
    from importlib.metadata import entry_points

    from infersight.instrumentation.vllm_adapter.providers import _span_exporter

    assert type(_span_exporter({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"})) is OTLPSpanExporter
    [entry] = [e for e in entry_points(group="opentelemetry_traces_exporter") if e.name == "infersight_otlp"]
    assert entry.load() is OTLPSpanExporter  # OTEL_TRACES_EXPORTER=infersight_otlp with opentelemetry-instrument


def test_the_encoders_caches_stay_bounded_with_unique_values():
    from infersight.instrumentation import otlp_encoder

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("lib")
    for i in range(otlp_encoder.CACHE.limit + 50):
        with tracer.start_as_current_span("s", attributes={"gen_ai.response.id": f"chatcmpl-{i}", "k": "v"}):
            pass
    spans = exporter.get_finished_spans()
    assert _ours(spans) == sdk_encode_spans(spans)
    assert len(otlp_encoder.CACHE.pairs) <= otlp_encoder.CACHE.limit


def test_the_shared_wire_primitives_decode_as_the_protobuf_classes_encode():
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ResourceMessage
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    from infersight.schemas import otlp_wire as w

    for n in (0, 1, 127, 128, 16383, 16384, 2**32, 2**64 - 1):
        assert w.varint(n) == w.varint_loop(n)
        assert KeyValue.FromString(w.key_value("k", n if n < 2**63 else -1)).value.int_value == (
            n if n < 2**63 else -1)
    cached = w.KeyValueCache(limit=2)
    for key, value in ATTRIBUTES.items():
        expected = KeyValue(key=key, value=_any(value))
        assert KeyValue.FromString(w.key_value(key, value)) == expected, key
        assert KeyValue.FromString(cached.key_value(key, value)) == expected, key
        assert KeyValue.FromString(cached.key_value(key, value)) == expected, key  # from the caches
    assert len(cached.keys) <= 2 and len(cached.pairs) <= 2
    span = Span.FromString(w.SPAN_TRACE_ID + b"\x01" * 16 + w.SPAN_SPAN_ID + b"\x02" * 8 + w.SPAN_PARENT_SPAN_ID
                           + b"\x03" * 8 + w.span_head("chat m", w.KIND_SERVER) + w.span_times(5, 2**63 + 7)
                           + w.IntAttr(w.SPAN_ATTRIBUTE, "n")(70_000) + w.DoubleAttr(w.SPAN_ATTRIBUTE, "x")(0.25)
                           + w.error_status("Boom"))
    assert (span.name, span.kind, span.start_time_unix_nano, span.end_time_unix_nano) == (
        "chat m", Span.SPAN_KIND_SERVER, 5, 2**63 + 7)
    assert span.parent_span_id == b"\x03" * 8 and span.status.code == span.status.STATUS_CODE_ERROR
    assert span.status.message == "Boom"
    assert [(kv.key, kv.value) for kv in span.attributes] == [("n", AnyValue(int_value=70_000)),
                                                                ("x", AnyValue(double_value=0.25))]
    assert InstrumentationScope.FromString(w.scope("lib", "1.0")) == InstrumentationScope(name="lib", version="1.0")
    assert ResourceMessage.FromString(w.resource({"a": "b", "n": 2})) == ResourceMessage(attributes=[
        KeyValue(key="a", value=AnyValue(string_value="b")), KeyValue(key="n", value=AnyValue(int_value=2))])


def _any(value):
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue

    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    return AnyValue(array_value=ArrayValue(values=[_any(v) for v in value]))
