"""The OpenAI client instrumentation on the real ``openai`` client; the server's HTTP side is an httpx
transport here (the real vLLM server: tests/integration/test_vllm_edge_ttft.py)."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.instrumentation.openai_client import OpenAIClientInstrumentor
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from tests.unit.fakes import metric_points

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")


def _chunk(delta=None, finish=None, usage=None, text=None):
    choice = {"index": 0, "finish_reason": finish}
    if text is not None:
        choice["text"] = text
    else:
        choice["delta"] = delta or {}
    body = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [choice] if usage is None else []}
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


@pytest.fixture
def inst():
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    i = OpenAIClientInstrumentor(tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[reader]))
    i.instrument()
    yield i, exporter, reader
    i.uninstrument()


def _client(handler):
    return openai.OpenAI(base_url="http://server:8000/v1", api_key="x", max_retries=0,
                         http_client=httpx.Client(transport=httpx.MockTransport(handler)))


def test_stream_ttft_is_the_first_token_chunk_and_traceparent_is_sent(inst):
    _i, exporter, reader = inst
    seen = {}

    def handler(request):
        seen["traceparent"] = request.headers.get("traceparent")
        body = (_chunk({"role": "assistant", "content": ""}) + _chunk({"content": "hi"})
                + _chunk({"content": "!"}, finish="length")
                + _chunk(usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}) + b"data: [DONE]\n\n")
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    stream = _client(handler).chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}],
                                                      stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hi!"
    (span,) = exporter.get_finished_spans()
    assert span.name == "chat m" and span.kind.name == "CLIENT"
    assert seen["traceparent"].split("-")[1] == format(span.context.trace_id, "032x")
    assert seen["traceparent"].split("-")[2] == format(span.context.span_id, "016x")
    attrs = span.attributes
    assert attrs[A.GEN_AI_USAGE_INPUT_TOKENS] == 3 and attrs[A.GEN_AI_USAGE_OUTPUT_TOKENS] == 2
    assert attrs[A.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert attrs["server.address"] == "server" and attrs["server.port"] == 8000
    assert 0 < attrs[A.CLIENT_TTFT] <= (span.end_time - span.start_time) / 1e9
    points = metric_points(reader)
    assert sum(p.count for p in points[M.CLIENT_TTFT_METRIC]) == 1


def test_role_only_stream_has_no_ttft_and_errors_are_typed(inst):
    _i, exporter, reader = inst

    def empty(request):
        return httpx.Response(200, content=_chunk({"role": "assistant", "content": ""}) + b"data: [DONE]\n\n",
                              headers={"content-type": "text/event-stream"})

    list(_client(empty).chat.completions.create(model="m", messages=[], stream=True))

    def failing(request):
        return httpx.Response(400, json={"error": {"message": "bad"}})

    with pytest.raises(openai.BadRequestError):
        _client(failing).completions.create(model="m", prompt="p", max_tokens=1)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert A.CLIENT_TTFT not in spans["chat m"].attributes
    assert spans["text_completion m"].attributes[A.ERROR_TYPE] == "BadRequestError"
    assert M.CLIENT_TTFT_METRIC not in metric_points(reader)


def test_whole_response_ttft_is_the_call(inst):
    _i, exporter, _reader = inst

    def handler(request):
        return httpx.Response(200, json={"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
                                         "choices": [{"index": 0, "text": "abc", "finish_reason": "stop"}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}})

    out = _client(handler).completions.create(model="m", prompt="p", max_tokens=3)
    assert out.choices[0].text == "abc"
    (span,) = exporter.get_finished_spans()
    assert span.attributes[A.GEN_AI_RESPONSE_ID] == "cmpl-1"
    assert 0 < span.attributes[A.CLIENT_TTFT] <= (span.end_time - span.start_time) / 1e9
