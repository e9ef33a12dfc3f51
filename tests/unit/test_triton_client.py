"""The real tritonclient (HTTP and gRPC, sync, async_infer and asyncio) against KServe v2 stand-ins on loopback:
the traceparent Triton would receive is the client span's context, and uninstrument really unpatches."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tritonclient.utils import InferenceServerException

from infersight.instrumentation.triton import TritonClientInstrumentor, trace_headers
from infersight.schemas import attributes as A
from infersight.schemas import triton as T
from tests.support.kserve_standin import MISSING_MODEL, GrpcStandIn, HttpStandIn


@pytest.fixture(scope="module")
def servers():
    with HttpStandIn() as http_server, GrpcStandIn() as grpc_server:
        yield http_server, grpc_server


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hooks: list = []
    inst = TritonClientInstrumentor()
    inst.instrument(tracer_provider=provider, request_hook=lambda span, model, headers: hooks.append(
        ("request", model, dict(headers))), response_hook=lambda span, result: hooks.append(("response", result)))
    try:
        yield provider, exporter, hooks
    finally:
        inst.uninstrument()


def _traceparent(span) -> str:
    ctx = span.context
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _inputs(module):
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return [tensor]


def test_http_infer_sends_the_client_span_as_traceparent(servers, traced):
    http_server, _ = servers
    provider, exporter, hooks = traced
    client = httpclient.InferenceServerClient(http_server.url)
    user_headers = {"x-user": "1"}
    with provider.get_tracer("test").start_as_current_span("caller") as caller:
        result = client.infer("llm", _inputs(httpclient), model_version="2", headers=user_headers)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32).reshape(1, 4))
    (span,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    received = http_server.received[-1]
    assert received["traceparent"] == _traceparent(span)
    assert received["x-user"] == "1"
    assert user_headers == {"x-user": "1"}, "the caller's dict must not be modified"
    assert span.parent.span_id == caller.get_span_context().span_id
    assert span.context.trace_id == caller.get_span_context().trace_id
    assert span.name == "POST /v2/models/{model_name}/infer"
    assert span.attributes[A.GEN_AI_REQUEST_MODEL] == "llm"
    assert span.attributes[T.TRITON_PROTOCOL] == "http"
    assert span.attributes[T.TRITON_MODEL_VERSION_ATTR] == "2"
    assert span.attributes[T.URL_PATH] == "/v2/models/llm/versions/2/infer"
    assert span.attributes[T.HTTP_REQUEST_METHOD] == "POST"
    assert span.attributes[T.SERVER_ADDRESS] == "127.0.0.1"
    assert span.attributes[T.SERVER_PORT] == http_server.port
    assert span.status.status_code is StatusCode.UNSET
    assert hooks[0][0] == "request" and hooks[0][2]["traceparent"] == _traceparent(span)
    assert hooks[1][0] == "response" and hooks[1][1] is result


def test_grpc_infer_sends_the_client_span_in_metadata(servers, traced):
    _, grpc_server = servers
    provider, exporter, _ = traced
    client = grpcclient.InferenceServerClient(grpc_server.url)
    result = client.infer("llm", _inputs(grpcclient), headers={"x-user": "2"})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.arange(4, dtype=np.float32).reshape(1, 4))
    (span,) = exporter.get_finished_spans()
    received = grpc_server.received[-1]
    assert received[":method"] == "ModelInfer"
    assert received["traceparent"] == _traceparent(span)
    assert received["x-user"] == "2"
    assert span.parent is None  # no caller span: the client span starts the trace
    assert span.name == "inference.GRPCInferenceService/ModelInfer"
    assert span.attributes[T.RPC_SYSTEM] == "grpc"
    assert span.attributes[T.RPC_METHOD] == "ModelInfer"
    assert span.attributes[T.SERVER_PORT] == grpc_server.port
    client.close()
    gone = weakref.ref(client)
    del client  # tritonclient closes again in __del__; do it while grpc is still loaded
    gc.collect()
    assert gone() is None, "the instrumentation keeps a client alive after its last use"


def test_errors_mark_the_span_and_still_raise(servers, traced):
    http_server, grpc_server = servers
    _, exporter, _ = traced
    with pytest.raises(InferenceServerException):
        httpclient.InferenceServerClient(http_server.url).infer(MISSING_MODEL, _inputs(httpclient))
    client = grpcclient.InferenceServerClient(grpc_server.url)
    with pytest.raises(InferenceServerException):
        client.infer(MISSING_MODEL, _inputs(grpcclient))
    client.close()
    del client  # tritonclient closes again in __del__; do it while grpc is still loaded
    http_span, grpc_span = exporter.get_finished_spans()
    for span in (http_span, grpc_span):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[A.ERROR_TYPE] == "InferenceServerException"
    assert http_span.attributes[T.HTTP_RESPONSE_STATUS_CODE] == 400
    assert grpc_span.attributes[T.RPC_GRPC_STATUS_CODE] == "NOT_FOUND"


def test_async_infer_http_and_grpc(servers, traced):
    http_server, grpc_server = servers
    _, exporter, _ = traced
    handle = httpclient.InferenceServerClient(http_server.url).async_infer("a", _inputs(httpclient))
    handle.get_result()
    done = threading.Event()
    results = []
    client = grpcclient.InferenceServerClient(grpc_server.url)
    client.async_infer("b", _inputs(grpcclient),
                       callback=lambda result, error: (results.append((result, error)), done.set()))
    assert done.wait(10)
    client.close()
    del client  # tritonclient closes again in __del__; do it while grpc is still loaded
    assert results[0][1] is None
    spans = {s.attributes[A.GEN_AI_REQUEST_MODEL]: s for s in exporter.get_finished_spans()}
    assert http_server.received[-1]["traceparent"] == _traceparent(spans["a"])
    assert grpc_server.received[-1]["traceparent"] == _traceparent(spans["b"])


def test_asyncio_clients(servers, traced):
    http_server, grpc_server = servers
    _, exporter, _ = traced

    async def main():
        async with httpaio.InferenceServerClient(http_server.url) as h:
            await h.infer("c", _inputs(httpaio))
        async with grpcaio.InferenceServerClient(grpc_server.url) as g:
            await g.infer("d", _inputs(grpcaio))

    asyncio.run(main())
    spans = {s.attributes[A.GEN_AI_REQUEST_MODEL]: s for s in exporter.get_finished_spans()}
    assert http_server.received[-1]["traceparent"] == _traceparent(spans["c"])
    assert grpc_server.received[-1]["traceparent"] == _traceparent(spans["d"])


def test_uninstrument_really_unpatches_and_instrument_is_idempotent(servers):
    http_server, _ = servers
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = TritonClientInstrumentor()
    inst.instrument(tracer_provider=provider)
    inst.instrument(tracer_provider=provider)  # second call: a warning, no double wrapping
    assert hasattr(httpclient.InferenceServerClient.infer, "__wrapped__")
    assert not hasattr(httpclient.InferenceServerClient.infer.__wrapped__, "__wrapped__")
    inst.uninstrument()
    assert not hasattr(httpclient.InferenceServerClient.infer, "__wrapped__")
    assert not hasattr(grpcclient.InferenceServerClient.infer, "__wrapped__")
    with provider.get_tracer("t").start_as_current_span("caller"):
        httpclient.InferenceServerClient(http_server.url).infer("e", _inputs(httpclient))
    assert "traceparent" not in http_server.received[-1]
    assert [s.name for s in exporter.get_finished_spans()] == ["caller"]


def test_trace_headers_replaces_stale_context_in_any_case():
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("s") as span:
        out = trace_headers({"TraceParent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01", "a": "b"})
    assert out == {"a": "b", "traceparent": _traceparent(span)}
    assert trace_headers(None) == {}  # no current span: nothing to inject
