"""Edge TTFT in the real vLLM OpenAI server: the plugin, loaded by vLLM from its entry point, wraps the
server's app with the edge timer (no vLLM change, no flag). Concurrent streaming chat requests, a
non-streamed one and a one-token completion, each with its own ``traceparent``; the spans and metrics the
server exports over OTLP (to an in-test OTLP/gRPC receiver: the stack is not needed to check the server)
must show, per request: engine TTFT <= edge TTFT <= the client's TTFT (1 ms clock tolerance), the stages
ingress, queue, prefill, egress contiguous and adding up to the edge TTFT, and the event-loop lag metric."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest
import requests

from infersight.flink_jobs.normalize.otlp_spans import iter_spans
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M

pytestmark = pytest.mark.integration

MAX_TOKENS = 12
N_STREAMS = 6
TOL_NS = 1_000_000
STAGES = ("ingress", "queue", "prefill", "egress")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from infersight.instrumentation.vllm_adapter.engine import OpenAIServer, engine_env
    from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model
    from tests.support.otlp_sink import OtlpSink

    sink = OtlpSink(keep=True).start()
    scratch = tmp_path_factory.mktemp("vllm-edge")
    env = engine_env(scratch, otlp_endpoint=sink.endpoint,
                     extra={"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "1000"})
    env.pop("VLLM_PLUGINS", None)
    os.environ.pop("VLLM_PLUGINS", None)  # the entry point must load by itself
    try:
        with OpenAIServer(build_tiny_model(), env=env, log_path=scratch / "server.log",
                          startup_timeout_s=600) as server:  # a loaded 2-core machine: minutes
            yield server, sink
    finally:
        sink.stop()


def _call(server, path: str, body: dict, traceparent: str) -> dict:
    """One request; the client's TTFT: send -> the first chunk with text (streamed) or the body (not)."""
    t0 = time.time()
    first = None
    with requests.post(server.url + path, json=body, stream=True, timeout=120,
                       headers={"traceparent": traceparent}) as resp:
        resp.raise_for_status()
        if not body.get("stream"):
            content = resp.content
            first = time.time()
            assert json.loads(content)["usage"]["completion_tokens"] >= 1
        else:
            for line in resp.iter_lines():
                if first is None and line.startswith(b"data: {"):
                    choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                    if choice.get("text") or (choice.get("delta") or {}).get("content"):
                        first = time.time()
    assert first is not None
    return {"t0": t0, "ttft_ns": int((first - t0) * 1e9)}


def test_edge_ttft_contains_the_engines_and_the_stages_add_up(served):
    server, sink = served
    chat = {"model": server.model, "messages": [{"role": "user", "content": "the quick brown fox"}],
            "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0}
    calls = [("/v1/chat/completions", {**chat, "stream": True}) for _ in range(N_STREAMS)]
    calls.append(("/v1/chat/completions", chat))  # not streamed: the body is the first token's bytes
    # finishes before its bytes are written; greedy and past EOS, so its one token is text (sampled, it could be
    # </s>, which streams no text)
    calls.append(("/v1/completions", {"model": server.model, "prompt": "a b c", "max_tokens": 1,
                                      "stream": True, "temperature": 0.0, "ignore_eos": True}))
    traces = {uuid.uuid4().hex: c for c in calls}
    client: dict[str, dict] = {}

    def run(trace_id, path, body):
        client[trace_id] = _call(server, path, body, f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01")

    threads = [threading.Thread(target=run, args=(t, *c)) for t, c in traces.items()]
    for th in threads:
        th.start()
    for th in threads:
        th.join(150)
    assert set(client) == set(traces)

    found: dict[str, dict[str, dict]] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found.clear()
        for request in list(sink.kept):
            for span in iter_spans(request.SerializeToString()):
                if span["trace_id"] in traces:
                    found.setdefault(span["trace_id"], {})[span["name"]] = span
        if len(found) == len(traces) and all(set(STAGES) <= set(s) for s in found.values()):
            break
        time.sleep(0.5)
    assert len(found) == len(traces), server.log_tail()

    for trace_id, spans in found.items():
        root = next(s for n, s in spans.items() if n.endswith(server.model))
        stages = [spans[name] for name in STAGES]
        for a, b in zip(stages, stages[1:], strict=False):
            assert a["end_time_unix_nano"] == b["start_time_unix_nano"], (a["name"], b["name"])
        assert stages[0]["start_time_unix_nano"] == root["start_time_unix_nano"]
        edge_ns = stages[-1]["end_time_unix_nano"] - stages[0]["start_time_unix_nano"]
        assert root["attributes"][A.TTFT] * 1e9 == pytest.approx(edge_ns, abs=2_000)  # the span's TTFT is the edge's
        engine_ns = spans["prefill"]["attributes"][A.ENGINE_TTFT] * 1e9
        assert 0 < engine_ns <= edge_ns + TOL_NS, (engine_ns, edge_ns)
        assert edge_ns <= client[trace_id]["ttft_ns"] + TOL_NS, (edge_ns, client[trace_id])
        assert stages[0]["start_time_unix_nano"] >= client[trace_id]["t0"] * 1e9 - TOL_NS  # edge inside client
        assert spans["decode"]["start_time_unix_nano"] == spans["prefill"]["end_time_unix_nano"]

    names = {m.name for r in sink.kept_metrics for rm in r.resource_metrics for sm in rm.scope_metrics
             for m in sm.metrics}
    deadline = time.monotonic() + 30
    while not {M.EVENT_LOOP_LAG, M.ENGINE_TTFT_METRIC} <= names and time.monotonic() < deadline:
        time.sleep(1)
        names = {m.name for r in sink.kept_metrics for rm in r.resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics}
    assert {M.EVENT_LOOP_LAG, M.EVENT_LOOP_LAG_MAX, M.ENGINE_TTFT_METRIC,
            M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN} <= names


def _server_spans(sink, trace_ids: set[str], want: int) -> dict[str, dict[str, dict]]:
    found: dict[str, dict[str, dict]] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found.clear()
        for request in list(sink.kept):
            for span in iter_spans(request.SerializeToString()):
                if span["trace_id"] in trace_ids:
                    found.setdefault(span["trace_id"], {})[span["name"]] = span
        if len(found) == want and all("egress" in s for s in found.values()):
            break
        time.sleep(0.5)
    return found


def test_openai_client_spans_join_the_servers_and_contain_the_edge(served):
    """The real OpenAI client, instrumented: its CLIENT span is the server span's parent (traceparent sent),
    and per request engine <= edge <= client TTFT."""
    from openai import OpenAI
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from infersight.instrumentation.openai_client import OpenAIClientInstrumentor
    from tests.unit.fakes import metric_points

    server, sink = served
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    inst = OpenAIClientInstrumentor(tracer_provider=tp, meter_provider=MeterProvider(metric_readers=[reader]))
    inst.instrument()
    try:
        client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "the lazy dog"}]
        texts = []
        for _ in range(3):
            stream = client.chat.completions.create(model=server.model, messages=messages, max_tokens=MAX_TOKENS,
                                                    stream=True, stream_options={"include_usage": True},
                                                    extra_body={"ignore_eos": True})
            texts.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        whole = client.chat.completions.create(model=server.model, messages=messages, max_tokens=MAX_TOKENS)
        assert whole.usage.completion_tokens == MAX_TOKENS and all(texts)
    finally:
        inst.uninstrument()

    mine = [s for s in exporter.get_finished_spans() if s.name == f"chat {server.model}"]
    assert len(mine) == 4
    by_trace = {format(s.context.trace_id, "032x"): s for s in mine}
    found = _server_spans(sink, set(by_trace), len(by_trace))
    assert len(found) == 4
    for trace_id, cspan in by_trace.items():
        spans = found[trace_id]
        root = next(s for n, s in spans.items() if n.endswith(server.model))
        assert root["parent_span_id"] == format(cspan.context.span_id, "016x")  # joined by traceparent
        assert cspan.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] == MAX_TOKENS
        client_ns = cspan.attributes[A.CLIENT_TTFT] * 1e9
        edge_ns = spans["egress"]["end_time_unix_nano"] - spans["ingress"]["start_time_unix_nano"]
        engine_ns = spans["prefill"]["attributes"][A.ENGINE_TTFT] * 1e9
        assert engine_ns <= edge_ns + TOL_NS and edge_ns <= client_ns + TOL_NS, (engine_ns, edge_ns, client_ns)
        assert root["start_time_unix_nano"] >= cspan.start_time - TOL_NS  # the server's interval inside
    points = metric_points(reader)
    assert sum(p.count for p in points[M.CLIENT_TTFT_METRIC]) == 4
    assert sum(p.count for p in points[M.GEN_AI_CLIENT_OPERATION_DURATION]) == 4
