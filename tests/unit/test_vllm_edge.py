"""The edge timer (ASGI, on a real FastAPI app over httpx's ASGI transport) and its join with the stats
translator (vLLM's own stats classes, fed as its logger feeds them): ingress, queue, prefill and egress
contiguous and adding up to the edge TTFT, the engine's TTFT kept as its own figure and metric."""

from __future__ import annotations

import asyncio
import json

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.instrumentation.vllm_adapter.edge import (
    CURRENT,
    FIRST_TOKEN_LATENCY,
    EdgeRegistry,
    EdgeTimer,
    EdgeTiming,
    carries_token,
)
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from tests.unit.fakes import metric_points

stats = pytest.importorskip("vllm.v1.metrics.stats")
engine = pytest.importorskip("vllm.v1.engine")
fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

NS = 1_000_000_000
T_END = 1_800_000_000.0


def _sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


ROLE = _sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
TOKEN = _sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]})


def test_carries_token_only_for_generated_text():
    assert not carries_token(ROLE)
    assert carries_token(TOKEN)
    assert carries_token(_sse({"choices": [{"index": 0, "text": "x"}]}))  # /v1/completions
    assert carries_token(_sse({"choices": [{"delta": {"tool_calls": [{"id": "t"}]}}]}))
    assert not carries_token(b"data: [DONE]\n\n")
    assert not carries_token(b"data: {not json\n\n")
    assert not carries_token(_sse({"choices": "nonsense"}))


def _app(registry: EdgeRegistry, seen: list, ticks: list):
    from fastapi.responses import JSONResponse, StreamingResponse

    app = fastapi.FastAPI()

    @app.post("/v1/chat/completions")
    async def chat():
        async def stream():
            registry.file_current("chatcmpl-1")  # where the plugin's add_request wrapper runs
            seen.append(CURRENT.get())
            ticks.append("role")
            yield ROLE
            ticks.append("token")
            yield TOKEN
            yield b"data: [DONE]\n\n"
        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completion():
        registry.file_current("cmpl-1")
        return JSONResponse({"choices": [{"text": "hello"}]})

    @app.get("/health")
    async def health():
        seen.append(CURRENT.get())
        return {}

    return app


def test_edge_timer_marks_the_first_token_chunk_and_files_the_timing():
    registry, seen, ticks = EdgeRegistry(), [], []
    clock_calls: list[str] = []

    def clock() -> int:  # the tick log tells which chunk had been sent when the clock was read
        clock_calls.append(ticks[-1] if ticks else "start")
        return len(clock_calls) * NS

    timed = EdgeTimer(_app(registry, seen, ticks), registry, clock=clock)

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=timed), base_url="http://t") as client:
            r = await client.post("/v1/chat/completions", json={})
            assert r.status_code == 200 and b"hi" in r.content
            r = await client.post("/v1/completions", json={})
            assert r.json()["choices"][0]["text"] == "hello"
            assert (await client.get("/health")).status_code == 200

    asyncio.run(run())
    chat = registry.pop("chatcmpl-1")
    assert isinstance(chat, EdgeTiming) and seen[0] is chat  # the handler saw the request's timing
    assert clock_calls[:2] == ["start", "token"]  # read on entry, then once the token chunk was sent
    assert chat.first_ns is not None and chat.first_ns > chat.start_ns and chat.closed
    whole = registry.pop("cmpl-1")
    assert whole is not None and whole.first_ns is not None and whole.first_ns > whole.start_ns
    assert seen[-1] is None  # other routes are not timed
    assert len(registry) == 0


def test_error_responses_have_no_first_token_and_release_waiters():
    from fastapi.responses import JSONResponse

    registry = EdgeRegistry()
    app = fastapi.FastAPI()

    @app.post("/v1/completions")
    async def bad():
        registry.file_current("cmpl-x")
        return JSONResponse({"error": "no"}, status_code=400)

    async def run():
        transport = httpx.ASGITransport(app=EdgeTimer(app, registry))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.post("/v1/completions", json={})).status_code == 400

    asyncio.run(run())
    timing = registry.pop("cmpl-x")
    assert timing is not None and timing.first_ns is None and timing.closed
    called = []
    timing.when_first_token(lambda: called.append(1))
    assert called == [1]


@pytest.fixture
def setup():
    from infersight.instrumentation.vllm_adapter.tracecontext import RequestParents
    from infersight.instrumentation.vllm_adapter.translate import StatsTranslator

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    edges = EdgeRegistry()
    translator = StatsTranslator("tiny-llama", tracer_provider=tp, meter_provider=MeterProvider(
        metric_readers=[reader]), vllm_tracing=False, parents=RequestParents(), gpu=False, edges=edges)
    return translator, edges, exporter, reader


def _finished(request_id="chatcmpl-1", n_out=4, gaps=(0.01, 0.01, 0.01), first_latency=0.2):
    # arrival at T_END - 0.5: queued 0.05 s later, scheduled at +0.1, first token (frontend) at +0.2
    f = stats.FinishedRequestStats(
        finish_reason=engine.FinishReason.LENGTH, request_id=request_id, e2e_latency=0.5, num_prompt_tokens=10,
        num_generation_tokens=n_out, queued_time=0.05, prefill_time=0.1, decode_time=sum(gaps))
    setattr(f, FIRST_TOKEN_LATENCY, first_latency)
    return f


def _step(finished, gaps=(0.01,)):
    it = stats.IterationStats()
    it.iteration_timestamp = T_END
    it.inter_token_latencies_iter = list(gaps)
    it.finished_requests = list(finished)
    return None, it


def _by_name(exporter):
    return {s.name: s for s in exporter.get_finished_spans()}


def test_edge_stages_are_contiguous_and_add_up_to_the_edge_ttft(setup):
    translator, edges, exporter, reader = setup
    arrival = int((T_END - 0.5) * NS)
    timing = EdgeTiming(arrival - 30_000_000)  # the HTTP layer had it 30 ms before the engine's arrival
    timing.first_ns = arrival + 200_000_000 + 7_000_000  # bytes written 7 ms after the engine's first token
    edges._by_request.put("chatcmpl-1", timing)
    for _ in range(2):
        translator.record(*_step([], gaps=(0.01,)))
    translator.record(*_step([_finished()]))

    spans = _by_name(exporter)
    root = spans["chat tiny-llama"]
    order = ["ingress", "queue", "prefill", "egress"]
    for a, b in zip(order, order[1:], strict=False):
        assert spans[a].end_time == spans[b].start_time, (a, b)
    assert spans["ingress"].start_time == root.start_time == timing.start_ns
    assert spans["egress"].end_time == timing.first_ns
    edge_ttft = (timing.first_ns - timing.start_ns) / NS
    assert sum(spans[n].end_time - spans[n].start_time for n in order) / NS == pytest.approx(edge_ttft, abs=1e-9)
    assert root.attributes[A.TTFT] == pytest.approx(edge_ttft, abs=1e-6)
    assert spans["prefill"].attributes[A.ENGINE_TTFT] == pytest.approx(0.2, abs=1e-6)  # vLLM's own
    assert spans["decode"].start_time == spans["prefill"].end_time
    assert spans["queue"].end_time - spans["queue"].start_time == pytest.approx(0.05 * NS, abs=10)
    assert root.attributes[A.ITL_MEAN] == pytest.approx(0.01, abs=1e-6)  # vLLM's gaps, shifted only
    m = metric_points(reader)
    assert sum(p.sum for p in m[M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]) == pytest.approx(edge_ttft, abs=1e-6)
    assert sum(p.sum for p in m[M.ENGINE_TTFT_METRIC]) == pytest.approx(0.2, abs=1e-6)


def test_a_request_finished_before_its_bytes_were_written_waits_for_them(setup):
    translator, edges, exporter, _reader = setup
    arrival = int((T_END - 0.5) * NS)
    timing = EdgeTiming(arrival - 1_000_000)
    edges._by_request.put("cmpl-1", timing)
    translator.record(*_step([_finished("cmpl-1", n_out=1, gaps=(), first_latency=0.5)], gaps=()))
    assert exporter.get_finished_spans() == ()  # not yet: the response is still being written
    timing.first_ns = int(T_END * NS) + 4_000_000
    timing._release()
    spans = _by_name(exporter)
    assert spans["egress"].end_time == timing.first_ns
    assert spans["text_completion tiny-llama"].attributes[A.TTFT] == pytest.approx(0.505, abs=1e-6)


def test_without_an_edge_the_engine_layout_is_unchanged(setup):
    translator, _edges, exporter, _reader = setup
    translator.record(*_step([_finished(gaps=(0.01,), n_out=2)]))
    spans = _by_name(exporter)
    assert "ingress" not in spans and "egress" not in spans
    # without an edge the engine-core intervals place the first token (the layout before edge timing)
    assert spans["chat tiny-llama"].attributes[A.TTFT] == pytest.approx(0.49, abs=1e-6)


def test_wrap_app_times_an_app_whose_stack_was_built_already():
    from fastapi.responses import JSONResponse

    from infersight.instrumentation.vllm_adapter.edge import _wrap_app

    registry = EdgeRegistry()
    app = fastapi.FastAPI()

    @app.post("/v1/completions")
    async def completion():
        registry.file_current("cmpl-1")
        return JSONResponse({"choices": [{"text": "x"}]})

    app.middleware_stack = app.build_middleware_stack()  # as vLLM's build_app leaves it
    assert _wrap_app(app, registry) is app

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            assert (await client.post("/v1/completions", json={})).status_code == 200

    asyncio.run(run())
    timing = registry.pop("cmpl-1")
    assert timing is not None and timing.first_ns is not None
