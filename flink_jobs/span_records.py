"""Request-level OTLP spans -> per-request records, for the three sources the contract understands:

- ours: the root span of ``infersight.instrumentation`` (``infersight.e2e`` and the stage attributes);
- vLLM's native ``llm_request`` span (``gen_ai.latency.*``, deprecated ``gen_ai.usage.prompt_tokens``);
- Triton's native request spans (``model_name`` and the ``REQUEST_START`` ... ``REQUEST_END`` events).

Pure functions: no Flink here. Every problem names the field (OTLP field or attribute) that caused it,
so the dead-letter record says exactly what to fix. Spans that are not request-level are skipped, not
dead-lettered: the full-trace topic carries them legitimately.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from infersight.flink_jobs.otlp_spans import any_value
from infersight.schemas import attributes as A
from infersight.schemas import triton as T
from infersight.schemas.records import RequestRecord, validate

NS = 1e9
MAX_DIMENSION_CHARS = 256  # model, version, region, error type: metric labels downstream
MAX_STRING_CHARS = 4096    # any other string attribute we read


@dataclass(frozen=True, slots=True)
class TimeBounds:
    """How far from the normaliser's clock a request may lie (both in seconds)."""

    max_future_s: float = 600.0
    max_age_s: float = 86_400.0


@dataclass(slots=True)
class Rejected:
    """A request-level span that broke the contract: its problems and the span alone, re-encoded."""

    problems: list[str]
    span_bytes: bytes
    trace_id: str


_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "double": (float, int), "string": (str,)}


class _Reader:
    """Typed access to one span's attributes that collects a problem per bad value."""

    def __init__(self, attrs: dict[str, Any], resource: dict[str, Any], problems: list[str]) -> None:
        self.attrs, self.resource, self.problems = attrs, resource, problems

    def get(self, name: str, typ: str, *, limit: int = MAX_STRING_CHARS, from_resource: bool = False) -> Any:
        value = self.attrs.get(name)
        if value is None and from_resource:
            value = self.resource.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, _TYPES[typ]):
            self.problems.append(f"{name}: expected {typ}, got {type(value).__name__} {str(value)[:40]!r}")
            return None
        if isinstance(value, str) and len(value) > limit:
            self.problems.append(f"{name}: value of {len(value)} characters exceeds {limit}")
            return None
        return float(value) if typ == "double" else value

    def first(self, typ: str, *names: str) -> Any:
        for name in names:
            value = self.get(name, typ)
            if value is not None:
                return value
        return None


def source_of(span: Span, attrs: dict[str, Any]) -> str | None:
    """Which request-level source a span is, or None for any other span."""
    if A.E2E in attrs:
        return "infersight"
    if A.VLLM_LATENCY_E2E in attrs or span.name == "llm_request":
        return "vllm"
    if T.TRITON_MODEL_NAME in attrs or any(e.name == T.REQUEST_START for e in span.events):
        return "triton"
    return None


def _finish_reason(reader: _Reader, span: Span, error: str | None) -> str | None:
    reasons = reader.attrs.get(A.GEN_AI_RESPONSE_FINISH_REASONS)
    if isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
        return reasons[0]  # validate() names it if it is not one of the contract's reasons
    if reasons is not None and not isinstance(reasons, list):
        reader.problems.append(f"{A.GEN_AI_RESPONSE_FINISH_REASONS}: expected string[], got "
                               f"{type(reasons).__name__}")
    return "error" if error or span.status.code == Status.STATUS_CODE_ERROR else "stop"


def _common(reader: _Reader, span: Span, engine_default: str) -> dict[str, Any]:
    error = reader.get(A.ERROR_TYPE, "string", limit=MAX_DIMENSION_CHARS)
    if error is None and span.status.code == Status.STATUS_CODE_ERROR:
        error = "_OTHER"  # semconv's fallback error.type when the span only says it failed
    engine = reader.get(A.ENGINE, "string", limit=MAX_DIMENSION_CHARS, from_resource=True) or engine_default
    if engine not in A.ENGINES:
        reader.problems.append(f"{A.ENGINE}: unknown engine {engine!r} (known: {', '.join(A.ENGINES)})")
    return {
        "region": reader.resource.get(A.CLOUD_REGION),
        "model_version": reader.get(A.MODEL_VERSION, "string", limit=MAX_DIMENSION_CHARS, from_resource=True) or "",
        "track": reader.get(A.DEPLOYMENT_TRACK, "string", limit=MAX_DIMENSION_CHARS, from_resource=True) or "stable",
        "engine": engine,
        "error_type": error,
        "finish_reason": _finish_reason(reader, span, error),
    }


def _ours(reader: _Reader) -> dict[str, Any]:
    g, d = reader.get, "double"
    return {
        "model": g(A.GEN_AI_REQUEST_MODEL, "string", limit=MAX_DIMENSION_CHARS),
        "e2e_s": g(A.E2E, d), "ttft_s": g(A.TTFT, d), "queue_s": g(A.QUEUE_DURATION, d),
        "prefill_s": g(A.PREFILL_DURATION, d), "decode_s": g(A.DECODE_DURATION, d),
        "itl_count": g(A.ITL_COUNT, "int") or 0, "itl_mean_s": g(A.ITL_MEAN, d), "itl_p50_s": g(A.ITL_P50, d),
        "itl_p90_s": g(A.ITL_P90, d), "itl_p99_s": g(A.ITL_P99, d), "itl_max_s": g(A.ITL_MAX, d),
        "tokens_in": g(A.GEN_AI_USAGE_INPUT_TOKENS, "int") or 0,
        "tokens_out": g(A.GEN_AI_USAGE_OUTPUT_TOKENS, "int") or 0,
        "tokens_cached": g(A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "int") or 0,
    }


def _vllm(reader: _Reader) -> dict[str, Any]:
    g, d = reader.get, "double"
    return {
        "model": reader.first("string", A.GEN_AI_RESPONSE_MODEL, A.GEN_AI_REQUEST_MODEL),
        "e2e_s": g(A.VLLM_LATENCY_E2E, d), "ttft_s": g(A.VLLM_LATENCY_TTFT, d),
        "queue_s": g(A.VLLM_LATENCY_QUEUE, d), "prefill_s": g(A.VLLM_LATENCY_PREFILL, d),
        "decode_s": g(A.VLLM_LATENCY_DECODE, d),
        "tokens_in": reader.first("int", A.GEN_AI_USAGE_INPUT_TOKENS, A.VLLM_USAGE_PROMPT_TOKENS) or 0,
        "tokens_out": reader.first("int", A.GEN_AI_USAGE_OUTPUT_TOKENS, A.VLLM_USAGE_COMPLETION_TOKENS) or 0,
        "tokens_cached": g(A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, "int") or 0,
    }


def _triton(reader: _Reader, span: Span) -> dict[str, Any]:
    events = [(e.name, e.time_unix_nano) for e in span.events if e.name in T.TRITON_EVENTS]
    timings = T.stage_durations(events)
    reader.problems.extend(f"span events: {p}" for p in timings.problems)
    stages = timings.durations
    e2e = stages.get("request")
    if e2e is None:
        e2e = (span.end_time_unix_nano - span.start_time_unix_nano) / NS
    return {
        "model": reader.first("string", A.GEN_AI_REQUEST_MODEL, T.TRITON_MODEL_NAME),
        "e2e_s": e2e, "queue_s": stages.get("queue"), "prefill_s": None, "decode_s": stages.get("compute"),
        "model_version": reader.get(T.TRITON_MODEL_VERSION, "string", limit=MAX_DIMENSION_CHARS) or "",
    }


def span_to_record(span: Span, resource: dict[str, Any], now_ns: int, bounds: TimeBounds
                   ) -> RequestRecord | list[str] | None:
    """The record of one request-level span, its problems, or None when the span is not request-level."""
    attrs = {kv.key: any_value(kv.value) for kv in span.attributes}
    source = source_of(span, attrs)
    if source is None:
        return None
    problems: list[str] = []
    reader = _Reader(attrs, resource, problems)
    start, end = span.start_time_unix_nano, span.end_time_unix_nano
    if start == 0:
        problems.append("start_time_unix_nano: missing")
    if end == 0:
        problems.append("end_time_unix_nano: missing")
    if start and end and end < start:
        problems.append(f"end_time_unix_nano: {end} is before start_time_unix_nano {start}")
    if end and end > now_ns + bounds.max_future_s * NS:
        problems.append(f"end_time_unix_nano: {(end - now_ns) / NS:.0f} s in the future "
                        f"(limit {bounds.max_future_s:.0f} s)")
    if start and start < now_ns - bounds.max_age_s * NS:
        problems.append(f"start_time_unix_nano: {(now_ns - start) / NS:.0f} s in the past "
                        f"(limit {bounds.max_age_s:.0f} s)")
    region = resource.get(A.CLOUD_REGION)
    if not isinstance(region, str) or not region or len(region) > MAX_DIMENSION_CHARS:
        problems.append(f"{A.CLOUD_REGION}: missing or not a short string on the resource "
                        "(the regional gateway stamps it)")
    fields = _common(reader, span, {"infersight": "custom", "vllm": "vllm", "triton": "triton"}[source])
    if source == "infersight":
        fields.update(_ours(reader))
    elif source == "vllm":
        fields.update(_vllm(reader))
    else:
        fields.update(_triton(reader, span))
    if fields["model"] is None and not any(p.startswith(("gen_ai.request.model", "gen_ai.response.model",
                                                         "model_name")) for p in problems):
        problems.append(f"{A.GEN_AI_REQUEST_MODEL}: missing")
    if problems:
        return problems
    fields.update(trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), start_ns=start, end_ns=end)
    record = RequestRecord(**fields)
    contract = validate(record)
    return contract or record


def records_from_payload(payload: bytes, now_ns: int, bounds: TimeBounds | None = None
                         ) -> Iterator[RequestRecord | Rejected]:
    """Every request-level span of one OTLP trace batch, as a record or a rejection.

    Raises ``google.protobuf.message.DecodeError`` when the bytes are not an OTLP trace request."""
    bounds = bounds or TimeBounds()
    request = ExportTraceServiceRequest.FromString(payload)
    for resource_spans in request.resource_spans:
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                result = span_to_record(span, resource, now_ns, bounds)
                if result is None or isinstance(result, RequestRecord):
                    if result is not None:
                        yield result
                    continue
                single = ExportTraceServiceRequest()
                rs = single.resource_spans.add()
                rs.resource.CopyFrom(resource_spans.resource)
                ss = rs.scope_spans.add()
                ss.scope.CopyFrom(scope_spans.scope)
                ss.spans.add().CopyFrom(span)
                yield Rejected(result, single.SerializeToString(), span.trace_id.hex())
