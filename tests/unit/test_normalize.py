"""The normalize job's pure core: spans from each source become the contract's record; bad input
lands in the DLQ with a reason naming the field, and valid records around it are kept."""

from __future__ import annotations

import base64
import json
import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.flink_jobs.normalize.core import normalize
from infersight.flink_jobs.normalize.span_records import TimeBounds, records_from_payload, span_to_record
from infersight.instrumentation import Instrumentation
from infersight.schemas import attributes as A
from infersight.schemas import triton as T
from infersight.schemas.records import RECORD_FIELDS, RequestRecord, parse_batch
from infersight.schemas.topics import DLQ, OTLP_METRICS, OTLP_REQUESTS, REQUESTS
from tests.bad_telemetry import KINDS, NOW, bad_payload, make_payload, make_span
from tests.support.otlp_requests import encode_requests
from tests.support.sample_requests import sample_records


def run(payload: bytes) -> tuple[list[dict], list[dict]]:
    now = time.time_ns()  # the normaliser's clock when it runs (tests may run long after import)
    out = list(normalize(OTLP_REQUESTS.name, 1, 42, payload, now))
    batches = [(parse_batch(v), ms) for t, v, ms in out if t == REQUESTS.name]
    assert len(batches) <= 1  # one batch per input record
    records = [r for batch, _ in batches for r in batch]
    dead = [json.loads(v) for t, v, _ in out if t == DLQ.name]
    # event time (the output's Kafka timestamp): the batch's latest request end; a dead letter's: when seen
    assert all(ms == max(r["end_ns"] for r in batch) // 1_000_000 for batch, ms in batches)
    assert all(ms == now // 1_000_000 for t, _, ms in out if t == DLQ.name)
    return records, dead


def sdk_request() -> tuple[bytes, RequestRecord]:
    """A request through our instrumentation and the real SDK; its spans encoded by the OTLP exporter's
    own encoder (what a gateway puts on Kafka)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({A.CLOUD_REGION: "eu-west-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    got: list[RequestRecord] = []
    inst = Instrumentation(tracer_provider=provider, meter_provider=MeterProvider(), gpu=False,
                           on_record=got.append, engine="vllm")
    with inst.request("llama-3-8b") as req:
        with req.stage("queue"):
            time.sleep(0.002)
        with req.stage("prefill"):
            time.sleep(0.001)
        req.first_token()
        for _ in range(8):
            time.sleep(0.0005)
            req.token()
        req.usage(input_tokens=40, output_tokens=9, cached_tokens=16)
        req.finish("stop")
    return encode_spans(exporter.get_finished_spans()).SerializeToString(), got[0]


def test_sdk_root_span_becomes_the_same_record_the_instrumentation_built():
    payload, expected = sdk_request()
    records, dead = run(payload)
    assert dead == [] and len(records) == 1  # stage spans are not requests
    got = records[0]
    exact = ("trace_id", "span_id", "region", "model", "start_ns", "end_ns", "track", "engine", "itl_count",
             "tokens_in", "tokens_out", "tokens_cached", "finish_reason", "error_type")
    assert {k: got[k] for k in exact} == {k: getattr(expected, k) for k in exact}
    for k in ("e2e_s", "ttft_s", "queue_s", "prefill_s", "itl_p99_s", "itl_max_s"):
        assert got[k] == pytest.approx(getattr(expected, k), rel=1e-9), k


def test_directly_encoded_root_spans_decode_to_identical_records():
    records = list(sample_records(50, NOW - 10**10, 5.0, seed=3))
    got, dead = run(encode_requests(records))
    assert dead == []
    assert sorted(got, key=lambda r: r["trace_id"]) == sorted((r.to_dict() for r in records),
                                                              key=lambda r: r["trace_id"])


def test_vllm_llm_request_span_is_mapped_from_its_own_names():
    span = make_span(**{A.GEN_AI_RESPONSE_MODEL: "tiny", A.VLLM_LATENCY_E2E: 0.9, A.VLLM_LATENCY_TTFT: 0.2,
                    A.VLLM_LATENCY_QUEUE: 0.05, A.VLLM_LATENCY_PREFILL: 0.15, A.VLLM_LATENCY_DECODE: 0.7,
                    A.VLLM_USAGE_PROMPT_TOKENS: 12, A.VLLM_USAGE_COMPLETION_TOKENS: 30})
    [record], dead = run(make_payload(span))
    assert dead == []
    assert (record["engine"], record["model"], record["tokens_in"], record["tokens_out"]) == ("vllm", "tiny", 12, 30)
    assert (record["ttft_s"], record["queue_s"], record["decode_s"]) == (0.2, 0.05, 0.7)


def test_triton_request_span_events_become_stages():
    span = make_span(**{T.TRITON_MODEL_NAME: "resnet", T.TRITON_MODEL_VERSION: "3"})
    span.name = "resnet"
    t0 = NOW - 2 * 10**9
    for name, dt in ((T.REQUEST_START, 0), (T.QUEUE_START, 1_000_000), (T.COMPUTE_START, 5_000_000),
                     (T.COMPUTE_END, 25_000_000), (T.REQUEST_END, 26_000_000)):
        span.events.add(name=name, time_unix_nano=t0 + dt)
    [record], dead = run(make_payload(span))
    assert dead == []
    assert (record["engine"], record["model"], record["model_version"]) == ("triton", "resnet", "3")
    assert record["queue_s"] == pytest.approx(0.004) and record["e2e_s"] == pytest.approx(0.026)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_bad_input_is_dead_lettered_with_a_reason_naming_the_field(kind):
    payload, field = bad_payload(kind)
    records, dead = run(payload)
    assert records == []
    [letter] = dead
    assert letter["reason"].startswith(field) or any(p.startswith(field) for p in letter["problems"]), letter
    assert letter["source"] == {"topic": OTLP_REQUESTS.name, "partition": 1, "offset": 42}
    raw = base64.b64decode(letter["raw_base64"])
    assert raw == payload if kind == "truncated protobuf" else len(raw) < len(payload) + 64


def test_bad_spans_do_not_take_the_good_ones_in_the_same_batch_with_them():
    good = list(sample_records(3, NOW - 10**10, 5.0, seed=5))
    bad = ExportTraceServiceRequest.FromString(bad_payload("unknown engine")[0])
    bad_span = bad.resource_spans[0].scope_spans[0].spans[0]
    req = ExportTraceServiceRequest.FromString(encode_requests(good))
    req.resource_spans[0].scope_spans[0].spans.insert(1, bad_span)
    records, dead = run(req.SerializeToString())
    assert [r["trace_id"] for r in records] == [r.trace_id for r in good]
    assert len(dead) == 1 and dead[0]["trace_id"] == "ab" * 16


def _source_span(source: str):
    """One request-level span of ``source``, with every attribute the mapping reads, and its record."""
    t0 = NOW - 2 * 10**9
    ids = {"trace_id": "ab" * 16, "span_id": "01" * 8, "region": "us-east-1", "start_ns": t0, "end_ns": t0 + 10**9}
    if source == "ours":
        span = make_span(**{A.E2E: 0.5, A.TTFT: 0.1, A.QUEUE_DURATION: 0.02, A.PREFILL_DURATION: 0.05,
                            A.DECODE_DURATION: 0.4, A.ITL_COUNT: 4, A.ITL_MEAN: 0.1, A.ITL_P50: 0.09,
                            A.ITL_P90: 0.12, A.ITL_P99: 0.13, A.ITL_MAX: 0.13, A.GEN_AI_REQUEST_MODEL: "m",
                            A.GEN_AI_USAGE_INPUT_TOKENS: 10, A.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
                            A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 2, A.ENGINE: "vllm",
                            A.DEPLOYMENT_TRACK: "canary", A.MODEL_VERSION: "v2"})
        span.name = "chat m"
        span.attributes.append(KeyValue(key=A.GEN_AI_RESPONSE_FINISH_REASONS, value=AnyValue(
            array_value=ArrayValue(values=[AnyValue(string_value="length")]))))
        expected = RequestRecord(
            **ids, model="m", e2e_s=0.5, model_version="v2", track="canary", engine="vllm", ttft_s=0.1,
            queue_s=0.02, prefill_s=0.05, decode_s=0.4, itl_count=4, itl_mean_s=0.1, itl_p50_s=0.09,
            itl_p90_s=0.12, itl_p99_s=0.13, itl_max_s=0.13, tokens_in=10, tokens_out=5, tokens_cached=2,
            finish_reason="length")
    elif source == "vllm":
        span = make_span(**{A.GEN_AI_RESPONSE_MODEL: "tiny", A.VLLM_LATENCY_E2E: 0.9, A.VLLM_LATENCY_TTFT: 0.2,
                            A.VLLM_LATENCY_QUEUE: 0.05, A.VLLM_LATENCY_PREFILL: 0.15, A.VLLM_LATENCY_DECODE: 0.7,
                            A.VLLM_USAGE_PROMPT_TOKENS: 12, A.VLLM_USAGE_COMPLETION_TOKENS: 30,
                            A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 4, A.ERROR_TYPE: "timeout"})
        expected = RequestRecord(
            **ids, model="tiny", e2e_s=0.9, engine="vllm", ttft_s=0.2, queue_s=0.05, prefill_s=0.15,
            decode_s=0.7, tokens_in=12, tokens_out=30, tokens_cached=4, finish_reason="error", error_type="timeout")
    else:
        span = make_span(**{T.TRITON_MODEL_NAME: "resnet", T.TRITON_MODEL_VERSION: "3"})
        span.name = "resnet"
        for name, dt in ((T.REQUEST_START, 0), (T.QUEUE_START, 1_000_000), (T.COMPUTE_START, 5_000_000),
                         (T.COMPUTE_END, 25_000_000), (T.REQUEST_END, 26_000_000)):
            span.events.add(name=name, time_unix_nano=t0 + dt)
        expected = RequestRecord(**ids, model="resnet", e2e_s=0.026, model_version="3", engine="triton",
                                 queue_s=0.004, decode_s=0.02, finish_reason="stop")
    return span, expected


@pytest.mark.parametrize("source", ["ours", "vllm", "triton"])
def test_each_source_becomes_exactly_its_record_by_every_path(source):
    """normalize builds the record's dict directly, from map-typed attributes; span_to_record and
    records_from_payload go through RequestRecord. All three give exactly the expected record, in the
    record's field order (the JSON is the same byte for byte)."""
    span, expected = _source_span(source)
    payload = make_payload(span)
    [record], dead = run(payload)
    assert dead == []
    assert record == expected.to_dict() and list(record) == list(RECORD_FIELDS)
    [from_payload] = records_from_payload(payload, time.time_ns())
    assert from_payload == expected
    assert span_to_record(span, {A.CLOUD_REGION: "us-east-1"}, time.time_ns(), TimeBounds()) == expected


def test_a_large_batch_leaves_in_messages_of_at_most_max_batch_records_each_stamped_with_its_own_latest_end():
    from infersight.flink_jobs.normalize.core import MAX_BATCH_RECORDS

    n = 2 * MAX_BATCH_RECORDS + 48  # a gateway batch of 2,048 request spans
    records = list(sample_records(n, time.time_ns() - 20 * 10**9, 10.0, seed=9))
    out = list(normalize(OTLP_REQUESTS.name, 0, 0, encode_requests(records), time.time_ns()))
    assert [topic for topic, _, _ in out] == [REQUESTS.name] * 3
    batches = [parse_batch(value) for _, value, _ in out]
    assert [len(b) for b in batches] == [MAX_BATCH_RECORDS, MAX_BATCH_RECORDS, 48]
    assert sorted(r["trace_id"] for b in batches for r in b) == sorted(r.trace_id for r in records)
    assert [ts for _, _, ts in out] == [max(r["end_ns"] for r in b) // 10**6 for b in batches]
    assert max(len(value.encode()) for _, value, _ in out) < 1_048_576  # the producer's default limit


def pod_metrics(resource: dict[str, str | int], value: float = 4.0) -> bytes:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    from infersight.schemas import metrics as M

    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    for key, v in resource.items():
        rm.resource.attributes.append(KeyValue(key=key, value=AnyValue(int_value=v) if isinstance(v, int)
                                               else AnyValue(string_value=v)))
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = M.QUEUE_DEPTH
    point = metric.gauge.data_points.add()
    point.as_double, point.time_unix_nano = value, time.time_ns()
    return req.SerializeToString()


def test_a_pods_gauges_carry_its_deployment_from_its_resource():
    from infersight.flink_jobs.normalize.pod_gauges import gauges_from_payload
    from infersight.schemas.pipeline import POD_MODEL_ATTRIBUTE

    pod = {A.CLOUD_REGION: "us-east-1", A.K8S_POD_NAME: "p-0", POD_MODEL_ATTRIBUTE: "llama",
           A.MODEL_VERSION: "v7", A.DEPLOYMENT_TRACK: "canary"}
    [point] = gauges_from_payload(pod_metrics(pod))
    assert (point["region"], point["model"], point["model_version"], point["track"]) == \
        ("us-east-1", "llama", "v7", "canary")
    bare = {A.CLOUD_REGION: "us-east-1", A.K8S_POD_NAME: "p-0"}  # as its requests': version "", track stable
    [point] = gauges_from_payload(pod_metrics(bare))
    assert (point["model"], point["model_version"], point["track"]) == ("", "", "stable")
    for bad, field in (({A.DEPLOYMENT_TRACK: "beta"}, A.DEPLOYMENT_TRACK), ({POD_MODEL_ATTRIBUTE: "m" * 300},
                                                                            POD_MODEL_ATTRIBUTE)):
        [problem] = gauges_from_payload(pod_metrics({**bare, **bad}))
        assert isinstance(problem, str) and problem.startswith(field)
        [(topic, value, _ms)] = normalize(OTLP_METRICS.name, 0, 1, pod_metrics({**bare, **bad}), time.time_ns())
        assert topic == DLQ.name and json.loads(value)["reason"].startswith(field)
