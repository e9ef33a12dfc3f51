"""The first real slice through the stack: SDK span -> regional otelcol -> Kafka -> Flink ->
Kafka, and an OTLP metric -> Kafka -> sink otelcol -> Prometheus."""

from __future__ import annotations

import json
import time
import uuid

import pytest
import requests
from confluent_kafka import Producer
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from infersight.flink_jobs.normalize.otlp_spans import iter_spans
from infersight.schemas.attributes import CLOUD_REGION
from infersight.schemas.topics import METRICS, OTLP_METRICS, OTLP_SPANS, Topic
from infersight.stack import jobs as flink
from infersight.stack.kafka_admin import ensure_topics
from tests.integration.kafka_util import consume_until
from tests.integration.pipeline_util import wait_until
from tests.support import span_tap

pytestmark = pytest.mark.integration


def send_span(endpoint: str, marker: str, claimed_region: str | None = None) -> str:
    """Export one span with the OpenTelemetry SDK over OTLP/gRPC; returns its trace id (hex)."""
    attrs = {"service.name": "slice-test"}
    if claimed_region:
        attrs[CLOUD_REGION] = claimed_region
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
    with provider.get_tracer("slice").start_as_current_span("chat slice-model") as span:
        span.set_attribute("test.marker", marker)
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


@pytest.fixture(scope="module")
def region(stack):
    return stack.layout.regions[1]


def test_span_reaches_kafka_with_region_stamped(stack, region):
    marker = str(uuid.uuid4())
    # The pod claims a wrong region; the gateway is the authority and overwrites it.
    trace_id = send_span(stack.layout.otlp_endpoint(region), marker, claimed_region="moon-1")

    def ours(msg):
        for span in iter_spans(msg.value()):
            if span["attributes"].get("test.marker") == marker:
                return msg, span
        return None

    msg, span = consume_until(stack.layout.kafka_bootstrap, OTLP_SPANS.name, ours)
    assert span["resource"][CLOUD_REGION] == region
    assert span["trace_id"] == trace_id
    assert span["name"] == "chat slice-model"
    # partition_traces_by_id: the record key is the trace id, so a trace stays on one partition.
    assert msg.key() is not None and msg.key().decode() == trace_id


def test_pod_metrics_reach_kafka_with_region_stamped(stack, region):
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    marker = str(uuid.uuid4())
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=stack.layout.otlp_endpoint(region), insecure=True),
        export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader], resource=Resource.create({"service.name": "slice-test"}))
    provider.get_meter("slice").create_counter("slice.requests").add(3, {"test.marker": marker})
    provider.force_flush()
    provider.shutdown()

    def ours(msg):
        req = ExportMetricsServiceRequest.FromString(msg.value())
        for rm in req.resource_metrics:
            region_attr = {kv.key: kv.value.string_value for kv in rm.resource.attributes}.get(CLOUD_REGION)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.sum.data_points:
                        if any(kv.value.string_value == marker for kv in point.attributes):
                            return region_attr, point.as_int
        return None

    assert consume_until(stack.layout.kafka_bootstrap, OTLP_METRICS.name, ours) == (region, 3)


def test_flink_job_reads_spans_topic_and_writes_another(stack, region):
    out_topic = Topic(f"test.span-tap.{uuid.uuid4().hex[:8]}", "json", "none", 1, 3_600_000, "test", "test")
    ensure_topics(stack.layout.kafka_bootstrap, [out_topic])
    job_id = flink.submit(stack.layout, "span_tap", [
        "--brokers", stack.layout.kafka_bootstrap, "--sink-topic", out_topic.name,
        "--group-id", f"test-{uuid.uuid4()}",
    ], py_files=[span_tap.__file__])  # a test module: shipped with the job, imported as `span_tap`
    try:
        marker = str(uuid.uuid4())
        trace_id = send_span(stack.layout.otlp_endpoint(region), marker)

        def ours(msg):
            record = json.loads(msg.value())
            return record if record["attributes"].get("test.marker") == marker else None

        record = consume_until(stack.layout.kafka_bootstrap, out_topic.name, ours, timeout_s=120)
        assert record["trace_id"] == trace_id
        assert record["resource"][CLOUD_REGION] == region
        assert record["end_time_unix_nano"] >= record["start_time_unix_nano"] > 0
        assert flink.job_state(stack.layout, job_id) == "RUNNING"
        # stopping takes a savepoint (its transactions commit) and the job ends FINISHED, not CANCELED
        savepoint = flink.stop(stack.layout, job_id)
        assert savepoint
        wait_until(lambda: flink.job_state(stack.layout, job_id) == "FINISHED", 30, "the job to finish")
    finally:
        flink.stop(stack.layout, job_id)  # a no-op when already stopped


def gauge_request(name: str, value: float, labels: dict[str, str]) -> bytes:
    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="slice-test")))
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = name
    point = metric.gauge.data_points.add()
    point.as_double = value
    point.time_unix_nano = time.time_ns()
    for k, v in labels.items():
        point.attributes.append(KeyValue(key=k, value=AnyValue(string_value=v)))
    return req.SerializeToString()


def test_metric_through_sink_collector_is_queryable_in_prometheus(stack):
    probe = uuid.uuid4().hex
    producer = Producer({"bootstrap.servers": stack.layout.kafka_bootstrap})
    producer.produce(METRICS.name, gauge_request("infersight_slice_probe", 42.5, {"probe": probe}))
    assert producer.flush(10) == 0
    query = f'infersight_slice_probe{{probe="{probe}"}}'
    deadline = time.monotonic() + 60
    result = []
    while time.monotonic() < deadline and not result:
        resp = requests.get(f"{stack.layout.prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
        result = resp.json()["data"]["result"]
        time.sleep(0.5)
    assert result, f"{query} never became queryable"
    assert float(result[0]["value"][1]) == 42.5
