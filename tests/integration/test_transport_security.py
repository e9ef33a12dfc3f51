"""Transport security, end to end on a stack of its own (Kafka + one gateway, with TLS and SASL on): a CA made
at test time; the gateway's OTLP receivers (mutual TLS) refuse a client without a certificate, with one from
another CA, or without TLS, and take a pod's export configured the standard way (``OTEL_EXPORTER_OTLP_*``);
what it takes reaches Kafka over SASL_SSL; Kafka refuses clients without TLS, without SASL or with a wrong
password; the sink collector joins its consumer group over SASL_SSL; the Flink jobs' Kafka sink, with the
properties file the stack hands the jobs, gets through; every socket stays on loopback."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from infersight.flink_jobs.common.kafka_io import KAFKA_PROPERTIES_ENV
from infersight.flink_jobs.normalize.otlp_spans import iter_spans
from infersight.schemas.topics import OTLP_SPANS, Topic
from infersight.stack import jobs, setup
from infersight.stack.kafka_admin import ensure_topics
from infersight.stack.ports import PortPlan
from infersight.stack.security import TransportSecurity
from infersight.stack.supervisor import Stack
from tests.integration.test_stack_lifecycle import listening_sockets
from tests.support.tls_certs import Pki, make_pki

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
USER, PASSWORD = "infersight-ingest", f"pw+{uuid.uuid4().hex}/="


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(stack, pki): Kafka, the us-east-1 gateway and the sink collector, started with INFERSIGHT_TLS_DIR and
    INFERSIGHT_KAFKA_SASL_* set, as a user would (no Prometheus: the sink has nothing to write yet)."""
    setup.ensure_all()
    root = tmp_path_factory.mktemp("secure")
    pki = make_pki(root, mutual=True)
    env = pytest.MonkeyPatch()
    env.setenv("INFERSIGHT_TLS_DIR", str(pki.tls_dir))
    env.setenv("INFERSIGHT_KAFKA_SASL_USER", USER)
    env.setenv("INFERSIGHT_KAFKA_SASL_PASSWORD", PASSWORD)
    stack = Stack(root / "stack", PortPlan.free())
    try:
        stack.up(only={"kafka", f"gateway-{REGION}", "sink"})
        yield stack, pki
    finally:
        stack.down(wipe=True)
        env.undo()


def grpc_target(stack) -> str:
    return stack.layout.otlp_endpoint(REGION).split("://", 1)[1]


def grpc_export(target: str, credentials: grpc.ChannelCredentials | None) -> None:
    channel = grpc.secure_channel(target, credentials) if credentials else grpc.insecure_channel(target)
    try:
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(trace_service_pb2.ExportTraceServiceRequest(),
                                                                 timeout=10)
    finally:
        channel.close()


def client_credentials(pki: Pki, cert=None) -> grpc.ChannelCredentials:
    ca = pki.ca.read_bytes()
    if cert is None:
        return grpc.ssl_channel_credentials(ca)
    return grpc.ssl_channel_credentials(ca, cert.key.read_bytes(), cert.cert.read_bytes())


def http_post(stack, pki: Pki, cert=None) -> int:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None:
        context.load_cert_chain(str(cert.cert), str(cert.key))
    request = urllib.request.Request(stack.layout.otlp_endpoint(REGION, "http") + "/v1/traces",
                                     data=trace_service_pb2.ExportTraceServiceRequest().SerializeToString(),
                                     headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(request, context=context, timeout=10) as resp:
        return resp.status


def send_span_as_a_pod(stack, pki: Pki, marker: str) -> None:
    """Export one span with the SDK's OTLP/gRPC exporter configured by the standard variables alone (what a
    serving pod sets), over mutual TLS."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", stack.layout.otlp_endpoint(REGION))
        env.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
        env.setenv("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", str(pki.client.cert))
        env.setenv("OTEL_EXPORTER_OTLP_CLIENT_KEY", str(pki.client.key))
        exporter = OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "tls-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tls-test").start_as_current_span("chat tls-model") as span:
        span.set_attribute("test.marker", marker)
    provider.shutdown()


def kafka_config(stack, **overrides) -> dict:
    return {"bootstrap.servers": stack.layout.kafka_bootstrap, "socket.timeout.ms": 3000, "log_level": 0,
            **overrides}


def secure_config(pki: Pki, password: str = PASSWORD) -> dict:
    return {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": USER,
            "sasl.password": password, "ssl.ca.location": str(pki.ca)}


def metadata_or_errors(config: dict, timeout_s: float = 8.0) -> tuple[int | None, set]:
    """(number of topics, or None when the broker could not be read; error codes reported meanwhile)."""
    errors: set = set()
    admin = AdminClient({**config, "error_cb": lambda e: errors.add(e.code())})
    try:
        topics = len(admin.list_topics(timeout=timeout_s).topics)
    except KafkaException:
        topics = None
    admin.poll(1)  # serve the error callbacks
    return topics, errors


def consume(config: dict, topic: str, match, timeout_s: float = 60.0):
    consumer = Consumer({**config, "group.id": f"test-{uuid.uuid4()}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and (found := match(msg)):
                return found
    finally:
        consumer.close()
    raise AssertionError(f"nothing matching arrived on {topic} within {timeout_s} s")


def test_gateway_refuses_otlp_clients_without_the_right_certificate(secure):
    stack, pki = secure
    target = grpc_target(stack)
    for what, credentials in [("no client certificate", client_credentials(pki)),
                              ("a client certificate from another CA", client_credentials(pki, pki.rogue_client)),
                              ("no TLS at all", None)]:
        with pytest.raises(grpc.RpcError) as refused:
            grpc_export(target, credentials)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, what
    grpc_export(target, client_credentials(pki, pki.client))  # the right one is accepted
    with pytest.raises((ssl.SSLError, urllib.error.URLError)):
        http_post(stack, pki)  # OTLP/HTTP: no client certificate, no handshake
    with pytest.raises((ssl.SSLError, urllib.error.URLError)):
        http_post(stack, pki, pki.rogue_client)
    assert http_post(stack, pki, pki.client) == 200


def test_a_pods_export_with_its_certificate_reaches_kafka_over_sasl_ssl(secure):
    stack, pki = secure
    marker = str(uuid.uuid4())
    send_span_as_a_pod(stack, pki, marker)

    def ours(msg) -> bool:
        return any(s["attributes"].get("test.marker") == marker for s in iter_spans(msg.value()))

    assert consume(kafka_config(stack, **secure_config(pki)), OTLP_SPANS.name, ours, timeout_s=90)


def test_kafka_refuses_clients_without_tls_sasl_or_the_right_password(secure):
    stack, pki = secure
    plaintext, _ = metadata_or_errors(kafka_config(stack))
    assert plaintext is None
    tls_only, _ = metadata_or_errors(kafka_config(stack, **{"security.protocol": "SSL",
                                                            "ssl.ca.location": str(pki.ca)}))
    assert tls_only is None
    wrong, errors = metadata_or_errors(kafka_config(stack, **secure_config(pki, password="not-" + PASSWORD)))
    assert wrong is None and KafkaError._AUTHENTICATION in errors
    untrusted, _ = metadata_or_errors(kafka_config(stack, **{**secure_config(pki), "ssl.ca.location":
                                                             str(pki.rogue_ca)}))
    assert untrusted is None  # a broker certificate the client's CA did not sign
    right, errors = metadata_or_errors(kafka_config(stack, **secure_config(pki)))
    assert right and not errors
    # the stack's own admin client reads the same settings from the environment
    assert TransportSecurity.from_env().librdkafka_config() == secure_config(pki)


def test_the_jobs_kafka_sink_gets_through_with_the_properties_the_stack_hands_the_jobs(secure):
    stack, pki = secure
    topic = Topic(f"test.secure-sink.{uuid.uuid4().hex[:8]}", "text", "none", 1, 3_600_000, "test", "test")
    ensure_topics(stack.layout.kafka_bootstrap, [topic])
    properties = jobs.kafka_client_properties_file(stack.layout)
    values = [f"secure-{uuid.uuid4().hex}", f"secure-{uuid.uuid4().hex}"]
    job = subprocess.run([sys.executable, "-m", "tests.support.kafka_sink_job", stack.layout.kafka_bootstrap,
                          topic.name, *values], cwd=REPO, capture_output=True, text=True, timeout=240,
                         env={**os.environ, KAFKA_PROPERTIES_ENV: str(properties), "JVM_ARGS": "-Xmx512m"})
    assert job.returncode == 0, job.stderr[-3000:]
    seen: set[str] = set()

    def both(msg) -> bool:
        seen.add(msg.value().decode())
        return set(values) <= seen

    assert consume(kafka_config(stack, **secure_config(pki)), topic.name, both, timeout_s=30)


def test_the_sink_collector_joins_its_consumer_group_over_sasl_ssl(secure):
    stack, pki = secure
    admin = AdminClient(kafka_config(stack, **secure_config(pki)))
    deadline = time.monotonic() + 60
    groups: set[str] = set()
    while time.monotonic() < deadline and "infersight-sink" not in groups:
        groups = {g.group_id for g in admin.list_consumer_groups(request_timeout=10).result().valid}
        time.sleep(1)
    assert "infersight-sink" in groups


def test_every_socket_stays_on_loopback_with_security_on(secure):
    stack, _ = secure
    sockets = listening_sockets(list(stack.running_components().values()))
    assert {stack.layout.ports.kafka, stack.layout.ports.gateways[0].otlp_grpc} <= {port for *_, port in sockets}
    exposed = [s for s in sockets if s[2] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
    assert not exposed, f"listening beyond loopback: {exposed}"
