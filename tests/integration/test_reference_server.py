"""The reference streaming server: real torch.compile'd model, real tokens, real HTTP (no Kafka stack needed)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.testclient import TestClient

from infersight.instrumentation import Instrumentation, Settings
from infersight.instrumentation.reference_server import Engine, create_app
from infersight.instrumentation.torch_compile import TorchCompileInstrumentor
from infersight.schemas import attributes as A
from infersight.schemas import torch_compile as N

TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def served():
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    mp = MeterProvider(metric_readers=[reader])
    compiles = TorchCompileInstrumentor()
    compiles.instrument(tracer_provider=tp, meter_provider=mp)
    inst = Instrumentation(tracer_provider=tp, meter_provider=mp, engine="torch.compile", gpu=False,
                           operation="text_completion", settings=Settings(region="eu-west-1"))
    engine = Engine(inst, backend="aot_eager", tracer_provider=tp, meter_provider=mp)
    try:
        with TestClient(create_app(engine)) as client:
            yield client, engine, exporter, reader
    finally:
        engine.close()
        compiles.uninstrument()


def _sse(text: str) -> list:
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_streaming_completion_is_traced_end_to_end(served):
    client, engine, exporter, _ = served
    exporter.clear()
    body = {"model": "infersight-tiny", "prompt": "hello", "max_tokens": 12, "stream": True, "seed": 7,
            "temperature": 0.8}
    response = client.post("/v1/completions", json=body, headers={"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse(response.text)
    assert events[-1] == "[DONE]"
    final = events[-2]
    tokens = [e["choices"][0]["text"] for e in events[:-2]]
    assert final["usage"]["prompt_tokens"] == 5
    assert final["usage"]["completion_tokens"] == len(tokens) > 0
    assert final["choices"][0]["finish_reason"] in ("stop", "length")
    assert response.headers["traceparent"].split("-")[1] == TRACE_ID  # W3C context out

    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == "text_completion infersight-tiny"]
    assert f"{root.context.trace_id:032x}" == TRACE_ID and f"{root.parent.span_id:016x}" == PARENT_ID
    stages = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id}
    assert {"queue", "prefill", "decode"} <= set(stages)
    assert root.attributes[A.GEN_AI_USAGE_OUTPUT_TOKENS] == len(tokens)
    assert root.attributes[A.GEN_AI_USAGE_INPUT_TOKENS] == 5
    assert 0 < root.attributes[A.TTFT] < root.attributes[A.E2E]
    assert root.attributes[A.ENGINE] == "torch.compile"
    assert A.GEN_AI_INPUT_MESSAGES not in root.attributes  # no content unless opted in
    if len(tokens) > 2:
        assert root.attributes[A.ITL_COUNT] == len(tokens) - 1
    calls = [s for s in spans if s.name == "torch.compile.call infersight-tiny"]
    assert len(calls) == len(tokens) + (final["choices"][0]["finish_reason"] == "stop")
    call_parents = {c.parent.span_id for c in calls}
    assert call_parents <= {stages["prefill"].context.span_id, stages["decode"].context.span_id}
    assert all(c.attributes[N.COMPILED_DURING_CALL] is False for c in calls)  # compiled at warm-up


def test_concurrent_requests_queue_and_metrics_count_every_request(served):
    client, _, exporter, reader = served
    exporter.clear()
    results = []

    def one(i):
        r = client.post("/v1/completions", json={"prompt": f"q{i}", "max_tokens": 20, "temperature": 0})
        results.append(r.json())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 3 and all(r["usage"]["completion_tokens"] > 0 for r in results)
    queue_s = sorted(s.attributes[A.QUEUE_DURATION] for s in exporter.get_finished_spans()
                     if s.name == "text_completion infersight-tiny")
    assert queue_s[-1] > 0.005 and queue_s[-1] > 5 * queue_s[0]  # the last one waited for the others
    data = reader.get_metrics_data()
    ttft = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "gen_ai.server.time_to_first_token" for p in m.data.data_points]
    assert sum(p.count for p in ttft) >= 4
    compiles = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == N.COMPILE_DURATION for p in m.data.data_points]
    assert sum(p.count for p in compiles) >= 1  # the warm-up compile


def test_content_only_when_opted_in_and_redacted_first(served):
    client, engine, exporter, _ = served
    exporter.clear()
    engine.inst.capture_content, engine.inst.redact = True, lambda text: text.replace("secret", "[redacted]")
    try:
        r = client.post("/v1/completions", json={"prompt": "my secret", "max_tokens": 3})
    finally:
        engine.inst.capture_content, engine.inst.redact = False, None
    assert r.status_code == 200
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "text_completion infersight-tiny"]
    assert "my [redacted]" in root.attributes[A.GEN_AI_INPUT_MESSAGES]
    assert "secret" not in root.attributes[A.GEN_AI_INPUT_MESSAGES]


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"prompt": 5}', b'{"max_tokens": "x"}',
                                  b'{"max_tokens": -1}', b'{"temperature": -2}', b'{"seed": 1.5}'])
def test_bad_requests_get_400_and_the_server_keeps_serving(served, body):
    client, _, _, _ = served
    r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    assert client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 1}).status_code == 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_module_entry_point_under_opentelemetry_instrument():
    """`opentelemetry-instrument python -m ...reference_server`: the torch.compile instrumentor comes from the
    entry point (its import hook fires when torch.compile imports torch._dynamo), spans go to the console."""
    port = _free_port()
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none",
           "OTEL_LOGS_EXPORTER": "none", "OTEL_SERVICE_NAME": "reference-test", "OTEL_BSP_SCHEDULE_DELAY": "100",
           "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "infersight_vllm"}
    proc = subprocess.Popen([str(VENV_BIN / "opentelemetry-instrument"), sys.executable, "-m",
                             "infersight.instrumentation.reference_server", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.5)
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                          json={"prompt": "hi", "max_tokens": 4, "stream": True}) as r:
            chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert chunks[-1] == "data: [DONE]"
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    assert '"name": "torch.compile TinyLM.forward"' in out or '"name": "torch.compile forward"' in out, out[-3000:]
    assert '"name": "text_completion infersight-tiny"' in out
    assert '"name": "torch.compile.call infersight-tiny"' in out
