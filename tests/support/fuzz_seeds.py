"""Seed inputs for the fuzz targets of ``bench/fuzz.py``: real payloads of every shape the decoders read,
built here (nothing stored), so the fuzzer's mutations start from valid messages and the unit smoke test
(``tests/unit/test_fuzz_regressions.py``) replays them.

All times are relative to ``NOW_NS``, the clock the targets give the normaliser, so every seed decodes the
same way on any day.
"""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from infersight.schemas import attributes as A
from infersight.schemas import triton as T
from infersight.schemas.pipeline import GPU_COUNT_ATTRIBUTE, GPU_TYPE_ATTRIBUTE, POD_GAUGE_ALIASES, POD_GAUGE_STATS
from infersight.schemas.records import dump_batch

NOW_NS = 1_780_000_000 * 10**9  # 2026-05-28: the normaliser's clock in every fuzz target
_T0 = NOW_NS - 5 * 10**9


def _any(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[_any(v) for v in value]))
    if isinstance(value, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=_any(v)) for k, v in value.items()]))
    raise TypeError(value)


def _kvs(attrs: dict[str, object]) -> list[KeyValue]:
    return [KeyValue(key=k, value=_any(v)) for k, v in attrs.items()]


def _span(name: str, attrs: dict[str, object], trace: int, start: int = _T0, end: int = _T0 + 10**9) -> Span:
    return Span(trace_id=trace.to_bytes(16, "big"), span_id=(trace & 0xFFFF_FFFF_FFFF_FFFF | 1).to_bytes(8, "big"),
                name=name, kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start, end_time_unix_nano=end,
                attributes=_kvs(attrs))


def _payload(*spans: Span, resource: dict[str, object] | None = None) -> bytes:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(_kvs({A.CLOUD_REGION: "us-east-1", A.SERVICE_NAME: "pod-0"}
                                       if resource is None else resource))
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = A.SCOPE_NAME, A.SCOPE_VERSION
    ss.spans.extend(spans)
    return request.SerializeToString()


def our_root_span(trace: int = 0xAB01) -> Span:
    """The root span of our instrumentation, every attribute the normaliser reads set."""
    span = _span("chat llama-3-8b", {
        A.E2E: 0.5, A.TTFT: 0.1, A.QUEUE_DURATION: 0.02, A.PREFILL_DURATION: 0.05, A.DECODE_DURATION: 0.4,
        A.ITL_COUNT: 4, A.ITL_MEAN: 0.1, A.ITL_P50: 0.09, A.ITL_P90: 0.12, A.ITL_P99: 0.13, A.ITL_MAX: 0.13,
        A.GEN_AI_REQUEST_MODEL: "llama-3-8b", A.GEN_AI_USAGE_INPUT_TOKENS: 10, A.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 2, A.ENGINE: "vllm", A.DEPLOYMENT_TRACK: "canary",
        A.MODEL_VERSION: "v2", A.GEN_AI_RESPONSE_FINISH_REASONS: ["length"]}, trace)
    return span


def vllm_span(trace: int = 0xAB02, error: bool = False) -> Span:
    """vLLM's native ``llm_request`` span (its own latency and deprecated usage names)."""
    attrs: dict[str, object] = {
        A.GEN_AI_RESPONSE_MODEL: "tiny", A.GEN_AI_REQUEST_MODEL: "tiny", A.VLLM_LATENCY_E2E: 0.9,
        A.VLLM_LATENCY_TTFT: 0.2, A.VLLM_LATENCY_QUEUE: 0.05, A.VLLM_LATENCY_PREFILL: 0.15,
        A.VLLM_LATENCY_DECODE: 0.7, A.VLLM_LATENCY_INFERENCE: 0.85, A.VLLM_USAGE_PROMPT_TOKENS: 12,
        A.VLLM_USAGE_COMPLETION_TOKENS: 30, A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 4,
        "gen_ai.request.id": "cmpl-1", "gen_ai.request.max_tokens": 64, "gen_ai.request.temperature": 0.7}
    if error:
        attrs[A.ERROR_TYPE] = "timeout"
    span = _span("llm_request", attrs, trace)
    if error:
        span.status.code = Status.STATUS_CODE_ERROR
    return span


def triton_span(trace: int = 0xAB03) -> Span:
    """A Triton request span: model name/version attributes and the request's timestamps as events."""
    span = _span("resnet", {T.TRITON_MODEL_NAME: "resnet", T.TRITON_MODEL_VERSION: "3"}, trace)
    for name, dt in ((T.REQUEST_START, 0), (T.QUEUE_START, 1_000_000), (T.COMPUTE_START, 5_000_000),
                     (T.COMPUTE_INPUT_END, 6_000_000), (T.COMPUTE_OUTPUT_START, 24_000_000),
                     (T.COMPUTE_END, 25_000_000), (T.REQUEST_END, 26_000_000)):
        span.events.add(name=name, time_unix_nano=_T0 + dt)
    return span


def sdk_payload(sampled: bool = True) -> bytes:
    """A request through our instrumentation and the real SDK (fixed clocks), encoded by our OTLP encoder:
    the root span, its stage spans when sampled, and the record-only root when not."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

    from infersight.instrumentation import Instrumentation, Settings
    from infersight.instrumentation.otlp_encoder import encode_spans

    ticks = iter(range(0, 10**10, 1_000_000))  # 1 ms a clock read
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_ON if sampled else ALWAYS_OFF,
                              resource=Resource.create({A.CLOUD_REGION: "eu-west-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = Instrumentation(tracer_provider=provider, meter_provider=MeterProvider(), settings=Settings(),
                           gpu=False, engine="vllm", clock=lambda: next(ticks), wall_clock=lambda: _T0)
    with inst.request("llama-3-8b") as req:
        with req.stage("queue"):
            pass
        with req.stage("prefill"):
            pass
        req.first_token()
        with req.stage("decode"):
            for _ in range(4):
                req.token()
        req.usage(input_tokens=40, output_tokens=5, cached_tokens=16)
        req.finish("stop")
    return encode_spans(exporter.get_finished_spans())


def otlp_span_payloads() -> list[bytes]:
    """Trace payloads: each source's request span, several in one batch, the SDK's, and off-contract ones
    (wrong types, a missing region, end before start, an unknown engine, a non-request span)."""
    off_contract = _span("chat m", {A.E2E: "fast", A.GEN_AI_REQUEST_MODEL: 7, A.ENGINE: "warp-drive",
                                    A.GEN_AI_RESPONSE_FINISH_REASONS: "stop"}, 0xAB04, end=_T0 - 1)
    child = _span("prefill", {A.STAGE: "prefill"}, 0xAB01)
    child.parent_span_id = b"\x01" * 8
    nested = _span("chat m", {A.E2E: 0.2, A.GEN_AI_REQUEST_MODEL: "m", "extra": {"a": [1, 2.5, "x", b"\x00"]}},
                   0xAB05)
    return [
        _payload(our_root_span()),
        _payload(vllm_span()),
        _payload(vllm_span(error=True)),
        _payload(triton_span()),
        _payload(our_root_span(), vllm_span(0xAB12), triton_span(0xAB13), child),
        _payload(off_contract, nested),
        _payload(our_root_span(), resource={A.SERVICE_NAME: "no-region"}),
        sdk_payload(sampled=True),
        sdk_payload(sampled=False),
    ]


def _gauge_request(metrics: list[tuple[str, str, float | int, dict[str, object]]],
                   resource: dict[str, object]) -> bytes:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.extend(_kvs(resource))
    sm = rm.scope_metrics.add()
    sm.scope.name = A.SCOPE_NAME
    for name, kind, value, point_attrs in metrics:
        metric = sm.metrics.add(name=name)
        if kind == "histogram":
            point = metric.histogram.data_points.add(count=1, sum=float(value), time_unix_nano=NOW_NS)
            continue
        point = getattr(metric, kind).data_points.add(time_unix_nano=NOW_NS, start_time_unix_nano=_T0)
        if isinstance(value, int):
            point.as_int = value
        else:
            point.as_double = value
        point.attributes.extend(_kvs(point_attrs))
    return request.SerializeToString()


def otlp_metric_payloads() -> list[bytes]:
    """Pod metric payloads: every pod gauge (ours and the engines' aliases) as gauge and sum, per-GPU points
    (``hw.id``), and off-contract ones (a histogram, no region, a point without time)."""
    pod = {A.CLOUD_REGION: "us-east-1", "k8s.pod.name": "vllm-0", GPU_TYPE_ATTRIBUTE: "H100",
           GPU_COUNT_ATTRIBUTE: 8, A.ENGINE: "vllm"}
    names = [*POD_GAUGE_STATS, *POD_GAUGE_ALIASES]
    gauges = [(name, "gauge" if i % 2 else "sum", 0.5 if i % 3 else 3, {A.HW_ID: f"gpu-{i}"} if i % 4 == 0 else {})
              for i, name in enumerate(names)]
    no_time = ExportMetricsServiceRequest.FromString(_gauge_request(gauges[:1], pod))
    no_time.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0].time_unix_nano = 0
    return [
        _gauge_request(gauges, pod),
        _gauge_request(gauges[:3], {"service.instance.id": "triton-1", A.CLOUD_REGION: "eu-west-1"}),
        _gauge_request([(names[0], "histogram", 1.0, {}), ("some.other.metric", "gauge", 1.0, {})], pod),
        _gauge_request(gauges[:2], {"host.name": "node-3"}),
        no_time.SerializeToString(),
    ]


def request_batches() -> list[bytes]:
    """``infersight.requests`` messages: batches of valid records as the normaliser writes them, one record
    alone (read as a batch of one), and malformed ones."""
    from tests.support.sample_requests import sample_records

    records = [r.to_dict() for r in sample_records(6, _T0, 4.0, seed=11)]
    lone = {k: v for k, v in records[0].items() if v is not None}
    return [dump_batch(records).encode(), dump_batch(records[:1]).encode(), dump_batch([lone]).encode(),
            b'{"trace_id":"ab","region":"r","model":"m","start_ns":1,"end_ns":2,"e2e_s":1e-9}', b"[]", b"[{}]",
            b'[1,"x",null,[],{"a":[]}]']


def header_blocks() -> list[bytes]:
    """Request header blocks (``name: value`` lines) as servers receive them, W3C trace context among them."""
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    blocks = [
        f"traceparent: {parent}",
        f"traceparent: {parent[:-2]}00\ntracestate: congo=t61rcWkgMzE\nx-request-id: chatcmpl-7",
        f"traceparent: {parent}\ntracestate: rojo=00f067aa0ba902b7,congo=t61rcWkgMzE\nbaggage: k=v;p=1,u=%20x",
        f"Traceparent: {parent}\nTRACESTATE: a=b\nx-request-id: 2_cmpl-9",
        f"traceparent: ff-{parent[3:]}\ncontent-type: application/json",
        f"traceparent: 01-{parent[3:]}-what-comes-next",
        "traceparent: 00-00000000000000000000000000000000-b7ad6b7169203331-01",
        "user-agent: curl/8.5.0\naccept: */*",
    ]
    return [b.encode() for b in blocks]
