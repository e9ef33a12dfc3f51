"""Metric and event names, instrument types and explicit bucket boundaries.

Semantic-convention metrics keep the conventions' advisory buckets so our histograms merge with
anyone else's (and with vLLM's, which share the TTFT boundaries). Where no convention exists
(inter-token latency, queue time, gauges) the name is ``infersight.*`` and the buckets are ours.
"""

from __future__ import annotations

from infersight.schemas.spec import Entry, Instrument, Kind, Source

# --- bucket boundaries (seconds unless said) ---
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
REQUEST_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                            81.92)
TOKEN_USAGE_BUCKETS = tuple(float(4**i) for i in range(14))  # 1, 4, 16, ..., 67108864
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.5, 0.75, 1.0, 2.5)
QUEUE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                 60.0)

ITL_BUCKETS_WHY = (
    "A decode step takes 5-50 ms on a GPU and 1 ms or less with small models or speculative decoding, so "
    "the bounds are dense from 1 ms to 100 ms; they end at 2.5 s like TPOT so the two compare directly. "
    "One observation per request (its p99 gap): stalls show, and no OTel call is made per token."
)
LOOP_LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.2, 0.5, 1.0, 2.5)
LOOP_LAG_BUCKETS_WHY = (
    "A wake-up late by 1 ms is normal and by 20-100 ms eats most of a 200 ms TTFT SLO: bounds dense from "
    "0.5 ms to 100 ms, then coarse to show a stalled loop."
)
QUEUE_BUCKETS_WHY = (
    "Queue time is a component of TTFT, whose SLO is ~200 ms: bounds resolve 0.5 ms-200 ms finely "
    "(0.2 is a bound) and continue to 60 s to show overload."
)

# --- GenAI semantic-convention metrics ---
GEN_AI_SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
GEN_AI_SERVER_REQUEST_DURATION = "gen_ai.server.request.duration"
GEN_AI_CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"
GEN_AI_CLIENT_OPERATION_DURATION = "gen_ai.client.operation.duration"
# --- hardware semantic conventions (GPU) ---
HW_GPU_UTILIZATION = "hw.gpu.utilization"
HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"
HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"
HW_GPU_MEMORY_UTILIZATION = "hw.gpu.memory.utilization"
# --- ours ---
ITL_P99_METRIC = "infersight.server.inter_token_latency.p99"
QUEUE_TIME_METRIC = "infersight.server.queue.duration"
QUEUE_DEPTH = "infersight.server.queue.depth"
REQUESTS_RUNNING = "infersight.server.requests.running"
KV_CACHE_USAGE = "infersight.server.kv_cache.usage"
BATCH_SIZE = "infersight.server.batch.size"
PREFIX_CACHE_QUERIES = "infersight.server.prefix_cache.queries"
PREFIX_CACHE_HITS = "infersight.server.prefix_cache.hits"
INSTRUMENTATION_ERRORS = "infersight.instrumentation.errors"
ENGINE_TTFT_METRIC = "infersight.server.engine.time_to_first_token"
CLIENT_TTFT_METRIC = "infersight.client.time_to_first_token"
EVENT_LOOP_LAG = "infersight.server.event_loop.lag"
EVENT_LOOP_LAG_MAX = "infersight.server.event_loop.lag.max"
# --- vLLM's Prometheus families, read and mapped ---
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_ITL = "vllm:inter_token_latency_seconds"
VLLM_TPOT = "vllm:time_per_output_token_seconds"
VLLM_E2E = "vllm:e2e_request_latency_seconds"
VLLM_QUEUE_TIME = "vllm:request_queue_time_seconds"
VLLM_NUM_WAITING = "vllm:num_requests_waiting"
VLLM_NUM_RUNNING = "vllm:num_requests_running"
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
# --- Triton's Prometheus families, read and mapped ---
TRITON_QUEUE_DURATION_US = "nv_inference_queue_duration_us"
TRITON_REQUEST_DURATION_US = "nv_inference_request_duration_us"
TRITON_GPU_UTILIZATION = "nv_gpu_utilization"
# --- events ---
GEN_AI_EVALUATION_RESULT = "gen_ai.evaluation.result"
SAFETY_CHECK_EVENT = "infersight.safety.result"

_DIMS = ("gen_ai.request.model, gen_ai.operation.name, gen_ai.provider.name, infersight.deployment.track, "
         "infersight.model.version, error.type; region comes from the resource")
_H, _C, _G = Instrument.HISTOGRAM, Instrument.COUNTER, Instrument.GAUGE
_SEM, _US, _V, _T = Source.SEMCONV, Source.INFERSIGHT, Source.VLLM, Source.TRITON


def _m(name: str, inst: Instrument, unit: str, source: Source, desc: str, buckets: tuple[float, ...] = (),
       why: str = "", card: str = _DIMS, emitted: bool = True, maps_to: str = "") -> Entry:
    typ = "int" if unit in ("{token}", "{request}", "{error}") else "double"
    return Entry(name, Kind.METRIC, typ, source, desc, unit=unit, cardinality=card, instrument=inst,
                 buckets=buckets, buckets_why=why, emitted=emitted, maps_to=maps_to)


def _read(name: str, inst: Instrument, unit: str, source: Source, maps_to: str) -> Entry:
    return _m(name, inst, unit, source, f"Engine's own metric family, read and mapped to {maps_to}.",
              card="engine's labels (model_name, engine)", emitted=False, maps_to=maps_to)


_SEMCONV_BUCKETS = "the semantic conventions' advisory boundaries"

METRICS: tuple[Entry, ...] = (
    _m(GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, _H, "s", _SEM,
       "Server-side time to first token, every request: from the server's HTTP layer having the request to "
       "the first token's bytes handed to the transport (edge TTFT). Servers without an HTTP-layer timer "
       "(an engine used in-process) report from the engine's arrival to its first token.",
       TTFT_BUCKETS, _SEMCONV_BUCKETS + " (shared with vLLM)"),
    _m(GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, _H, "s", _SEM,
       "Mean time per output token after the first, per request with 2+ output tokens.",
       TPOT_BUCKETS, _SEMCONV_BUCKETS),
    _m(GEN_AI_SERVER_REQUEST_DURATION, _H, "s", _SEM, "Server-side request duration, every request.",
       REQUEST_DURATION_BUCKETS, _SEMCONV_BUCKETS),
    _m(GEN_AI_CLIENT_TOKEN_USAGE, _H, "{token}", _SEM,
       "Tokens per request by gen_ai.token.type (input/output); the conventions define no server-side "
       "token metric, token counts are the same on both sides.", TOKEN_USAGE_BUCKETS, _SEMCONV_BUCKETS),
    _m(GEN_AI_CLIENT_OPERATION_DURATION, _H, "s", _SEM,
       "Client-observed duration; read only, never mixed with server-side durations.",
       REQUEST_DURATION_BUCKETS, _SEMCONV_BUCKETS, emitted=False),
    _m(ITL_P99_METRIC, _H, "s", _US, "Per request, the p99 of its inter-token gaps (no semconv ITL metric).",
       ITL_BUCKETS, ITL_BUCKETS_WHY),
    _m(QUEUE_TIME_METRIC, _H, "s", _US, "Per request, time waiting for the scheduler (excludes prefill).",
       QUEUE_BUCKETS, QUEUE_BUCKETS_WHY),
    _m(ENGINE_TTFT_METRIC, _H, "s", _US,
       "The engine's own time to first token (vLLM: engine arrival to the first token's output), every "
       "request; at most gen_ai.server.time_to_first_token, which adds ingress and egress.",
       TTFT_BUCKETS, _SEMCONV_BUCKETS + " of TTFT, so the two compare bucket by bucket"),
    _m(CLIENT_TTFT_METRIC, _H, "s", _US,
       "The client's time to first token (OpenAI client instrumentation): the call to the first chunk that "
       "carries a token, or to the whole response when not streamed; at least the server's edge TTFT.",
       TTFT_BUCKETS, _SEMCONV_BUCKETS + " of TTFT, so client, edge and engine compare bucket by bucket"),
    _m(EVENT_LOOP_LAG, _H, "s", _US,
       "How late the API server's event loop woke a 20 ms timer: every request's handler and stream waits "
       "that long (vLLM's OpenAI server process).", LOOP_LAG_BUCKETS, LOOP_LAG_BUCKETS_WHY,
       card="none: one series per process (resource attributes)"),
    _m(EVENT_LOOP_LAG_MAX, _G, "s", _US, "Largest event-loop lag since the previous collection.",
       card="none: one series per process (resource attributes)"),
    _m(QUEUE_DEPTH, _G, "{request}", _US, "Requests waiting to be scheduled.", card="engine"),
    _m(REQUESTS_RUNNING, _G, "{request}", _US, "Requests being processed.", card="engine"),
    _m(KV_CACHE_USAGE, _G, "1", _US, "Fraction of KV-cache blocks in use (0-1).", card="engine"),
    _m(BATCH_SIZE, _G, "{request}", _US, "Requests in the last scheduled batch.", card="engine"),
    _m(PREFIX_CACHE_QUERIES, _C, "{token}", _US, "Prompt tokens looked up in the prefix cache.",
       card="engine"),
    _m(PREFIX_CACHE_HITS, _C, "{token}", _US, "Prompt tokens found in the prefix cache.", card="engine"),
    _m(INSTRUMENTATION_ERRORS, _C, "{error}", _US,
       "Bad input seen by the instrumentation, never raised into serving code.",
       card="infersight.instrumentation.error.kind: fixed set"),
    _m(HW_GPU_UTILIZATION, _G, "1", _SEM, "GPU utilisation (0-1) from NVML.", card="hw.id"),
    _m(HW_GPU_MEMORY_USAGE, _G, "By", _SEM, "GPU memory used, from NVML.", card="hw.id"),
    _m(HW_GPU_MEMORY_LIMIT, _G, "By", _SEM, "GPU memory total, from NVML.", card="hw.id"),
    _m(HW_GPU_MEMORY_UTILIZATION, _G, "1", _SEM,
       "Fraction of time GPU memory was read or written (memory bandwidth), from NVML.", card="hw.id"),
    _read(VLLM_TTFT, _H, "s", _V, GEN_AI_SERVER_TIME_TO_FIRST_TOKEN),
    _read(VLLM_ITL, _H, "s", _V, ITL_P99_METRIC + " (vLLM records every gap; not the same statistic)"),
    _read(VLLM_TPOT, _H, "s", _V, GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN),
    _read(VLLM_E2E, _H, "s", _V, GEN_AI_SERVER_REQUEST_DURATION),
    _read(VLLM_QUEUE_TIME, _H, "s", _V, QUEUE_TIME_METRIC),
    _read(VLLM_NUM_WAITING, _G, "{request}", _V, QUEUE_DEPTH),
    _read(VLLM_NUM_RUNNING, _G, "{request}", _V, REQUESTS_RUNNING),
    _read(VLLM_KV_CACHE_USAGE, _G, "1", _V, KV_CACHE_USAGE),
    _read(VLLM_PREFIX_CACHE_QUERIES, _C, "{token}", _V, PREFIX_CACHE_QUERIES),
    _read(VLLM_PREFIX_CACHE_HITS, _C, "{token}", _V, PREFIX_CACHE_HITS),
    _read(TRITON_QUEUE_DURATION_US, _C, "us", _T, QUEUE_TIME_METRIC + " (cumulative microseconds)"),
    _read(TRITON_REQUEST_DURATION_US, _C, "us", _T, GEN_AI_SERVER_REQUEST_DURATION + " (cumulative us)"),
    _read(TRITON_GPU_UTILIZATION, _G, "1", _T, HW_GPU_UTILIZATION),
)

EVENTS: tuple[Entry, ...] = (
    Entry(GEN_AI_EVALUATION_RESULT, Kind.EVENT, "span event", _SEM,
          "Quality evaluation result on the request's root span: gen_ai.evaluation.name, "
          ".score.value, .score.label, .explanation, plus infersight.evaluation.sample_rate.",
          cardinality="sampled: at most one per evaluator per request"),
    Entry(SAFETY_CHECK_EVENT, Kind.EVENT, "span event", _US,
          "One guardrail check on the safety span: infersight.safety.check, .direction, .verdict.",
          cardinality="a few per request"),
)
