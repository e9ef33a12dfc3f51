"""Attribute names: resource, span and event attributes we emit or read.

OpenTelemetry semantic-convention names first; vLLM's spellings are understood on input and mapped;
``infersight.*`` only where no convention exists. Code imports the constants, never the literals.
"""

from __future__ import annotations

from infersight.schemas.spec import Entry, Kind, Source

# --- the instrumentation scope our spans and metrics carry ---
SCOPE_NAME = "infersight.instrumentation"
SCOPE_VERSION = "0.1.0"

# --- resource (OpenTelemetry resource semantic conventions) ---
CLOUD_REGION = "cloud.region"
SERVICE_NAME = "service.name"
SERVICE_VERSION = "service.version"
K8S_POD_NAME = "k8s.pod.name"
K8S_NAMESPACE_NAME = "k8s.namespace.name"

# --- GenAI semantic conventions ---
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_EVALUATION_NAME = "gen_ai.evaluation.name"
GEN_AI_EVALUATION_SCORE_VALUE = "gen_ai.evaluation.score.value"
GEN_AI_EVALUATION_SCORE_LABEL = "gen_ai.evaluation.score.label"
GEN_AI_EVALUATION_EXPLANATION = "gen_ai.evaluation.explanation"
ERROR_TYPE = "error.type"
HW_ID = "hw.id"
# the OpenTelemetry metrics SDK's overflow series: the one attribute of the point that takes every measurement
# past a stream's cardinality limit
OTEL_METRIC_OVERFLOW = "otel.metric.overflow"
# semconv's fallback value (error.type's, http.request.method's): what a metric label value past its bound becomes
OTHER_VALUE = "_OTHER"

# --- vLLM spellings, read and mapped (vLLM's llm_request span) ---
VLLM_LATENCY_TTFT = "gen_ai.latency.time_to_first_token"
VLLM_LATENCY_E2E = "gen_ai.latency.e2e"
VLLM_LATENCY_QUEUE = "gen_ai.latency.time_in_queue"
VLLM_LATENCY_PREFILL = "gen_ai.latency.time_in_model_prefill"
VLLM_LATENCY_DECODE = "gen_ai.latency.time_in_model_decode"
VLLM_LATENCY_INFERENCE = "gen_ai.latency.time_in_model_inference"
VLLM_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
VLLM_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"

# --- ours, where no convention exists ---
DEPLOYMENT_TRACK = "infersight.deployment.track"
MODEL_VERSION = "infersight.model.version"
ENGINE = "infersight.engine"
STAGE = "infersight.stage"
TTFT = "infersight.ttft"
ENGINE_TTFT = "infersight.engine.ttft"
CLIENT_TTFT = "infersight.client.ttft"
TPOT = "infersight.tpot"
E2E = "infersight.e2e"
QUEUE_DURATION = "infersight.stage.queue.duration"
PREFILL_DURATION = "infersight.stage.prefill.duration"
DECODE_DURATION = "infersight.stage.decode.duration"
ITL_COUNT = "infersight.itl.count"
ITL_MEAN = "infersight.itl.mean"
ITL_P50 = "infersight.itl.p50"
ITL_P90 = "infersight.itl.p90"
ITL_P99 = "infersight.itl.p99"
ITL_MAX = "infersight.itl.max"
SAFETY_DIRECTION = "infersight.safety.direction"
SAFETY_VERDICT = "infersight.safety.verdict"
SAFETY_CHECK = "infersight.safety.check"
EVALUATION_SAMPLE_RATE = "infersight.evaluation.sample_rate"
INSTRUMENTATION_ERROR_KIND = "infersight.instrumentation.error.kind"
RECORD_ONLY = "infersight.record_only"
CARDINALITY_FOLDED = "infersight.cardinality.folded"

TRACKS = ("stable", "canary", "shadow")
ENGINES = ("vllm", "triton", "torch.compile", "custom")  # values of infersight.engine the jobs accept
SAFETY_VERDICTS = ("pass", "flag", "block")

_S, _SEM, _V, _US = Kind.SPAN, Source.SEMCONV, Source.VLLM, Source.INFERSIGHT
_LOW = "low: a handful of values per deployment"
_PER_REQ = "per request: span only, never a metric dimension"


def _res(name: str, typ: str, desc: str, card: str) -> Entry:
    return Entry(name, Kind.RESOURCE, typ, _SEM, desc, cardinality=card)


def _span(name: str, typ: str, desc: str, unit: str = "", card: str = _PER_REQ, source: Source = _US,
          dim: bool = False) -> Entry:
    return Entry(name, _S, typ, source, desc, unit=unit, cardinality=card, metric_dimension=dim)


def _vllm(name: str, typ: str, unit: str, maps_to: str, deprecated: bool = False) -> Entry:
    return Entry(name, _S, typ, _V, f"vLLM's spelling on its llm_request span; read and mapped to {maps_to}",
                 unit=unit, cardinality=_PER_REQ, emitted=False, maps_to=maps_to, deprecated=deprecated)


ATTRIBUTES: tuple[Entry, ...] = (
    _res(CLOUD_REGION, "string", "Region serving the request; set from INFERSIGHT_REGION.", "low: 3-20 regions"),
    _res(SERVICE_NAME, "string", "Logical name of the serving service (OTEL_SERVICE_NAME).", _LOW),
    _res(SERVICE_VERSION, "string", "Version of the serving service.", _LOW),
    _res(K8S_POD_NAME, "string", "Pod that served the request; resource only, never a metric dimension.",
         "high: one per pod"),
    _res(K8S_NAMESPACE_NAME, "string", "Kubernetes namespace of the pod.", _LOW),
    _span(GEN_AI_OPERATION_NAME, "string", "Operation: chat, text_completion, embeddings, ...", card=_LOW,
          source=_SEM, dim=True),
    _span(GEN_AI_PROVIDER_NAME, "string", "Serving provider/engine family (e.g. vllm, triton, custom).",
          card=_LOW, source=_SEM, dim=True),
    Entry(GEN_AI_SYSTEM, _S, "string", _SEM, "Deprecated predecessor of gen_ai.provider.name; read only.",
          cardinality=_LOW, emitted=False, maps_to=GEN_AI_PROVIDER_NAME, deprecated=True),
    _span(GEN_AI_REQUEST_MODEL, "string", "Model the request asked for.",
          card=f"low: models served (on metrics, values past a per-label bound become {OTHER_VALUE})",
          source=_SEM, dim=True),
    _span(GEN_AI_RESPONSE_MODEL, "string", "Model that actually answered.", card="low: models served",
          source=_SEM),
    _span(GEN_AI_RESPONSE_ID, "string", "Engine's request id.", source=_SEM),
    _span(GEN_AI_RESPONSE_FINISH_REASONS, "string[]", "Why generation stopped: stop, length, abort, error.",
          source=_SEM),
    _span(GEN_AI_USAGE_INPUT_TOKENS, "int", "Prompt tokens.", "{token}", source=_SEM),
    _span(GEN_AI_USAGE_OUTPUT_TOKENS, "int", "Generated tokens.", "{token}", source=_SEM),
    _span(GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "int", "Prompt tokens served from the prefix cache.",
          "{token}", source=_SEM),
    _span(GEN_AI_TOKEN_TYPE, "string", "input or output; dimension of the token usage metric.", card="2 values",
          source=_SEM, dim=True),
    _span(GEN_AI_INPUT_MESSAGES, "string (JSON)", "Prompt text; only when opted in, after redaction.",
          source=_SEM),
    _span(GEN_AI_OUTPUT_MESSAGES, "string (JSON)", "Response text; only when opted in, after redaction.",
          source=_SEM),
    Entry(GEN_AI_EVALUATION_NAME, Kind.EVENT_ATTRIBUTE, "string", _SEM, "Name of the quality evaluator.",
          cardinality=_LOW),
    Entry(GEN_AI_EVALUATION_SCORE_VALUE, Kind.EVENT_ATTRIBUTE, "double", _SEM, "Evaluator's score."),
    Entry(GEN_AI_EVALUATION_SCORE_LABEL, Kind.EVENT_ATTRIBUTE, "string", _SEM, "Evaluator's label.",
          cardinality=_LOW),
    Entry(GEN_AI_EVALUATION_EXPLANATION, Kind.EVENT_ATTRIBUTE, "string", _SEM, "Evaluator's explanation."),
    Entry(EVALUATION_SAMPLE_RATE, Kind.EVENT_ATTRIBUTE, "double", _US,
          "Fraction of requests the judge evaluates (0-1]; estimates weight by 1/rate."),
    _span(ERROR_TYPE, "string", "Error class or code when the request failed; absent on success.",
          card=f"low: error classes (on metrics, values past a per-label bound become {OTHER_VALUE})",
          source=_SEM, dim=True),
    Entry(HW_ID, Kind.SPAN, "string", _SEM, "GPU identifier (NVML index) on GPU gauges.",
          cardinality="low: GPUs per node", metric_dimension=True),
    _vllm(VLLM_LATENCY_TTFT, "double", "s", TTFT),
    _vllm(VLLM_LATENCY_E2E, "double", "s", E2E),
    _vllm(VLLM_LATENCY_QUEUE, "double", "s", QUEUE_DURATION),
    _vllm(VLLM_LATENCY_PREFILL, "double", "s", PREFILL_DURATION),
    _vllm(VLLM_LATENCY_DECODE, "double", "s", DECODE_DURATION),
    _vllm(VLLM_LATENCY_INFERENCE, "double", "s", "prefill + decode"),
    _vllm(VLLM_USAGE_PROMPT_TOKENS, "int", "{token}", GEN_AI_USAGE_INPUT_TOKENS, deprecated=True),
    _vllm(VLLM_USAGE_COMPLETION_TOKENS, "int", "{token}", GEN_AI_USAGE_OUTPUT_TOKENS, deprecated=True),
    _span(DEPLOYMENT_TRACK, "string", "Rollout track: stable, canary or shadow (INFERSIGHT_DEPLOYMENT_TRACK).",
          card="3 values", dim=True),
    _span(MODEL_VERSION, "string", "Model version / checkpoint (INFERSIGHT_MODEL_VERSION).",
          card="low: versions live at once", dim=True),
    _span(ENGINE, "string", "Serving engine: vllm, triton, torch.compile, custom.", card=_LOW, dim=True),
    _span(STAGE, "string", "Stage of a stage span: routing, ingress, queue, prefill, egress, decode, safety.",
          card="7 values"),
    _span(TTFT, "double", "Server-side time to first token of this request (the edge TTFT where the server's "
          "HTTP layer is timed: see gen_ai.server.time_to_first_token).", "s"),
    _span(ENGINE_TTFT, "double", "The engine's own time to first token (engine arrival to first token output); "
          "on the prefill stage.", "s"),
    _span(SERVER_ADDRESS, "string", "Host the client called (CLIENT spans of the OpenAI client instrumentation).",
          source=_SEM),
    _span(SERVER_PORT, "int", "Port the client called (CLIENT spans).", source=_SEM),
    _span(CLIENT_TTFT, "double", "The client's time to first token, on its CLIENT span (see "
          "infersight.client.time_to_first_token).", "s"),
    _span(TPOT, "double", "Mean time per output token after the first.", "s"),
    _span(E2E, "double", "Server-side request duration.", "s"),
    _span(QUEUE_DURATION, "double", "Time waiting for the scheduler (excludes prefill).", "s"),
    _span(PREFILL_DURATION, "double", "Prefill (prompt processing) time.", "s"),
    _span(DECODE_DURATION, "double", "Decode time, first to last token.", "s"),
    _span(ITL_COUNT, "int", "Number of inter-token gaps summarised.", "{gap}"),
    _span(ITL_MEAN, "double", "Mean inter-token latency of the request.", "s"),
    _span(ITL_P50, "double", "Median inter-token latency of the request.", "s"),
    _span(ITL_P90, "double", "90th percentile inter-token latency (nearest rank).", "s"),
    _span(ITL_P99, "double", "99th percentile inter-token latency (nearest rank).", "s"),
    _span(ITL_MAX, "double", "Longest inter-token stall of the request.", "s"),
    _span(SAFETY_DIRECTION, "string", "Guardrail applied to input or output.", card="2 values"),
    _span(SAFETY_VERDICT, "string", "Guardrail verdict: pass, flag or block.", card="3 values"),
    _span(SAFETY_CHECK, "string", "Name of the guardrail check.", card=_LOW),
    _span(RECORD_ONLY, "boolean",
          "True on the root span of a request whose trace was sampled out: exported alone as the request's "
          "record (metrics must not depend on sampling); gateways send it to infersight.otlp.requests only.",
          card="2 values"),
    _span(CARDINALITY_FOLDED, "string[]",
          f"On a root span whose request's metric attributes were past their per-label bound in this pod: the "
          f"attributes its metrics recorded as {OTHER_VALUE} (the span keeps the real values).",
          card="a few values"),
    Entry(OTEL_METRIC_OVERFLOW, Kind.SPAN, "boolean", _SEM,
          "True on the one point of a metric that takes every measurement past its cardinality limit (the "
          "OpenTelemetry metrics SDK's overflow series; it has no other attribute).",
          cardinality="1 value", metric_dimension=True),
    Entry(INSTRUMENTATION_ERROR_KIND, Kind.SPAN, "string", _US,
          "Kind of bad input seen by the instrumentation (dimension of its self-telemetry counter).",
          cardinality="low: fixed set of kinds", metric_dimension=True),
)
