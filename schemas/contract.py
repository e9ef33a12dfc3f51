"""The request record's contract in one table: record field <-> span attribute(s) <-> type <-> unit.

Every producer and consumer reads it: the instrumentation builds its root span's attributes from it, the
normalize job's span decoder reads them back with it, the simulator encodes its spans with it, and the
telemetry reference documents it. ``RequestRecord`` (``records.py``) is the typed row: it checks at import
that both name the same fields in the same order, and ``validate`` takes each field's type from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from infersight.schemas import attributes as A


@dataclass(frozen=True, slots=True)
class RecordField:
    """One field of the request record and where it comes from on the wire.

    ``attribute``: the attribute our root span carries it in (None: from the span itself, e.g. its ids and
    times, or derived); ``on_resource``: also read from the resource when the span lacks it; ``vllm``:
    vLLM's native ``llm_request`` spellings, read in order when ours is absent."""

    name: str
    type: str  # "string" | "int" | "double"
    unit: str  # UCUM as OpenTelemetry writes it: "s", "ns", "{token}", "{gap}", "" for labels
    attribute: str | None = None
    on_resource: bool = False
    vllm: tuple[str, ...] = ()
    description: str = ""


REQUEST_FIELDS: tuple[RecordField, ...] = (
    RecordField("trace_id", "string", "", None, description="W3C trace id of the request span (32 hex)."),
    RecordField("region", "string", "", A.CLOUD_REGION, on_resource=True,
                description="Region the regional gateway stamps on the resource."),
    RecordField("model", "string", "", A.GEN_AI_REQUEST_MODEL, vllm=(A.GEN_AI_RESPONSE_MODEL,),
                description="Requested model."),
    RecordField("start_ns", "int", "ns", None, description="Span start, Unix nanoseconds."),
    RecordField("end_ns", "int", "ns", None, description="Span end, Unix nanoseconds."),
    RecordField("e2e_s", "double", "s", A.E2E, vllm=(A.VLLM_LATENCY_E2E,),
                description="Server-side request duration."),
    RecordField("span_id", "string", "", None, description="Request span id (16 hex): with trace_id, identity."),
    RecordField("model_version", "string", "", A.MODEL_VERSION, on_resource=True,
                description="Deployed model version."),
    RecordField("track", "string", "", A.DEPLOYMENT_TRACK, on_resource=True,
                description="Deployment track: stable, canary or shadow."),
    RecordField("engine", "string", "", A.ENGINE, on_resource=True, description="Serving engine."),
    RecordField("ttft_s", "double", "s", A.TTFT, vllm=(A.VLLM_LATENCY_TTFT,),
                description="Server-side time to first token."),
    RecordField("queue_s", "double", "s", A.QUEUE_DURATION, vllm=(A.VLLM_LATENCY_QUEUE,),
                description="Time waiting for the scheduler (excludes prefill)."),
    RecordField("prefill_s", "double", "s", A.PREFILL_DURATION, vllm=(A.VLLM_LATENCY_PREFILL,),
                description="Prefill time."),
    RecordField("decode_s", "double", "s", A.DECODE_DURATION, vllm=(A.VLLM_LATENCY_DECODE,),
                description="Decode time, first to last token."),
    RecordField("itl_count", "int", "{gap}", A.ITL_COUNT, description="Inter-token gaps summarised."),
    RecordField("itl_mean_s", "double", "s", A.ITL_MEAN, description="Mean inter-token latency."),
    RecordField("itl_p50_s", "double", "s", A.ITL_P50, description="Median inter-token latency (nearest rank)."),
    RecordField("itl_p90_s", "double", "s", A.ITL_P90, description="p90 inter-token latency (nearest rank)."),
    RecordField("itl_p99_s", "double", "s", A.ITL_P99, description="p99 inter-token latency (nearest rank)."),
    RecordField("itl_max_s", "double", "s", A.ITL_MAX, description="Longest inter-token stall."),
    RecordField("tokens_in", "int", "{token}", A.GEN_AI_USAGE_INPUT_TOKENS, vllm=(A.VLLM_USAGE_PROMPT_TOKENS,),
                description="Prompt tokens."),
    RecordField("tokens_out", "int", "{token}", A.GEN_AI_USAGE_OUTPUT_TOKENS,
                vllm=(A.VLLM_USAGE_COMPLETION_TOKENS,), description="Generated tokens."),
    RecordField("tokens_cached", "int", "{token}", A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
                description="Prompt tokens served from the prefix cache."),
    RecordField("finish_reason", "string", "", A.GEN_AI_RESPONSE_FINISH_REASONS,
                description="First of the span's finish reasons (a string array on the wire)."),
    RecordField("error_type", "string", "", A.ERROR_TYPE, description="error.type of a failed request."),
)

BY_NAME: dict[str, RecordField] = {f.name: f for f in REQUEST_FIELDS}

# The request's ITL summary on the root span, in the order the instrumentation's summary holds it.
ITL_FIELDS: tuple[RecordField, ...] = tuple(
    BY_NAME[n] for n in ("itl_count", "itl_mean_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s"))
# Durations a request may carry, each optional (stage order).
STAGE_DURATION_FIELDS: tuple[RecordField, ...] = tuple(
    BY_NAME[n] for n in ("ttft_s", "queue_s", "prefill_s", "decode_s"))
# Our root span's numeric attributes: field name -> attribute, by type (what a decoder reads per type).
DOUBLE_ATTRIBUTES: dict[str, str] = {
    f.name: f.attribute for f in REQUEST_FIELDS if f.type == "double" and f.attribute}
INT_ATTRIBUTES: dict[str, str] = {
    f.name: f.attribute for f in REQUEST_FIELDS if f.type == "int" and f.attribute}
# What validate() checks per type: durations are finite seconds >= 0, counts integers >= 0 (times apart).
DURATION_FIELDS: tuple[str, ...] = tuple(f.name for f in REQUEST_FIELDS if f.type == "double")
COUNT_FIELDS: tuple[str, ...] = tuple(f.name for f in REQUEST_FIELDS if f.type == "int" and f.unit != "ns")
