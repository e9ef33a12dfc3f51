"""Request-level OTLP spans -> per-request records, for the three sources the contract understands:

- ours: the root span of ``infersight.instrumentation`` (``infersight.e2e`` and the stage attributes);
- vLLM's native ``llm_request`` span (``gen_ai.latency.*``, deprecated ``gen_ai.usage.prompt_tokens``);
- Triton's native request spans (``model_name`` and the ``REQUEST_START`` ... ``REQUEST_END`` events).

Pure functions: no Flink here. Every problem names the field (OTLP field or attribute) that caused it,
so the dead-letter record says exactly what to fix. Spans that are not request-level are skipped, not
dead-lettered: the full-trace topic carries them legitimately.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import MISSING, dataclass
from dataclasses import fields as dataclass_fields
from typing import Any

from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from infersight.flink_jobs.normalize.otlp_spans import TracesView, any_value
from infersight.schemas import attributes as A
from infersight.schemas import triton as T
from infersight.schemas.records import _SLACK_S, FINISH_REASONS, RequestRecord, validate
from infersight.schemas.units import NS

MAX_DIMENSION_CHARS = 256  # model, version, region, error type: metric labels downstream
MAX_STRING_CHARS = 4096    # any other string attribute we read
_ERROR = Status.STATUS_CODE_ERROR
_ENGINE_DEFAULTS = {"infersight": "custom", "vllm": "vllm", "triton": "triton"}


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
    """Typed access to one span's attributes that collects a problem per bad value.

    ``attrs`` maps each key to its raw ``AnyValue``, converted only when read: a root span carries ~20
    attributes, and converting all of them up front was a quarter of the normaliser's cost. ``double``,
    ``integer`` and ``string`` take the common case (the value has the expected type) straight from the
    message (``HasField`` costs a fraction of ``WhichOneof``) and leave the rest (absent from the span
    but on the resource, another type, too long) to ``_check``, which words the problems."""

    __slots__ = ("attrs", "resource", "problems")

    def __init__(self, attrs: Mapping[str, AnyValue], resource: dict[str, Any], problems: list[str]) -> None:
        self.attrs, self.resource, self.problems = attrs, resource, problems

    def get(self, name: str, typ: str, *, limit: int = MAX_STRING_CHARS, from_resource: bool = False) -> Any:
        return self._check(name, self.attrs.get(name), typ, limit, from_resource)

    def _check(self, name: str, raw: AnyValue | None, typ: str, limit: int, from_resource: bool) -> Any:
        """``get`` for an attribute already looked up (``raw``: its AnyValue, None when absent)."""
        value = None if raw is None else any_value(raw)
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

    def double(self, name: str) -> float | None:
        raw = self.attrs.get(name)
        if raw is None:
            return None
        if raw.HasField("double_value"):
            return raw.double_value
        return self._check(name, raw, "double", MAX_STRING_CHARS, False)

    def integer(self, name: str) -> int | None:
        raw = self.attrs.get(name)
        if raw is None:
            return None
        if raw.HasField("int_value"):
            return raw.int_value
        return self._check(name, raw, "int", MAX_STRING_CHARS, False)

    def string(self, name: str, limit: int = MAX_STRING_CHARS, from_resource: bool = False) -> str | None:
        raw = self.attrs.get(name)
        if raw is not None and raw.HasField("string_value"):
            value = raw.string_value
            if len(value) <= limit:
                return value
        return self._check(name, raw, "string", limit, from_resource)

    def first(self, typ: str, *names: str) -> Any:
        for name in names:
            value = self.get(name, typ)
            if value is not None:
                return value
        return None


def source_of(span: Span, attrs: Mapping[str, Any]) -> str | None:
    """Which request-level source a span is, or None for any other span."""
    if A.E2E in attrs:
        return "infersight"
    if A.VLLM_LATENCY_E2E in attrs or span.name == "llm_request":
        return "vllm"
    if T.TRITON_MODEL_NAME in attrs:
        return "triton"
    events = span.events
    if events and any(e.name == T.REQUEST_START for e in events):  # most spans have none: skip the generator
        return "triton"
    return None


_FINISH_REASON_ENCODINGS = {
    AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=r)])).SerializeToString(): r for r in FINISH_REASONS}


def _finish_reason(reader: _Reader, failed: bool, error: str | None) -> str | None:
    raw = reader.attrs.get(A.GEN_AI_RESPONSE_FINISH_REASONS)
    if raw is None:
        reasons = None
    else:
        # The common case, ["stop"] or another of the contract's reasons: one lookup by the value's encoding
        # (exactly these bytes are exactly that array) instead of converting the array.
        reason = _FINISH_REASON_ENCODINGS.get(raw.SerializeToString())
        if reason is not None:
            return reason
        reasons = any_value(raw)
    if isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
        return reasons[0]  # validate() names it if it is not one of the contract's reasons
    if reasons is not None and not isinstance(reasons, list):
        reader.problems.append(f"{A.GEN_AI_RESPONSE_FINISH_REASONS}: expected string[], got "
                               f"{type(reasons).__name__}")
    return "error" if error or failed else "stop"


def _common(reader: _Reader, span: Span, engine_default: str) -> dict[str, Any]:
    failed = span.status.code == _ERROR
    error = reader.string(A.ERROR_TYPE, MAX_DIMENSION_CHARS)
    if error is None and failed:
        error = "_OTHER"  # semconv's fallback error.type when the span only says it failed
    engine = reader.string(A.ENGINE, MAX_DIMENSION_CHARS, from_resource=True) or engine_default
    if engine not in A.ENGINES:
        reader.problems.append(f"{A.ENGINE}: unknown engine {engine!r} (known: {', '.join(A.ENGINES)})")
    return {
        "region": reader.resource.get(A.CLOUD_REGION),
        "model_version": reader.string(A.MODEL_VERSION, MAX_DIMENSION_CHARS, from_resource=True) or "",
        "track": reader.string(A.DEPLOYMENT_TRACK, MAX_DIMENSION_CHARS, from_resource=True) or "stable",
        "engine": engine,
        "error_type": error,
        "finish_reason": _finish_reason(reader, failed, error),
    }


def _ours(reader: _Reader) -> dict[str, Any]:
    d, i = reader.double, reader.integer
    return {
        "model": reader.string(A.GEN_AI_REQUEST_MODEL, MAX_DIMENSION_CHARS),
        "e2e_s": d(A.E2E), "ttft_s": d(A.TTFT), "queue_s": d(A.QUEUE_DURATION),
        "prefill_s": d(A.PREFILL_DURATION), "decode_s": d(A.DECODE_DURATION),
        "itl_count": i(A.ITL_COUNT) or 0, "itl_mean_s": d(A.ITL_MEAN), "itl_p50_s": d(A.ITL_P50),
        "itl_p90_s": d(A.ITL_P90), "itl_p99_s": d(A.ITL_P99), "itl_max_s": d(A.ITL_MAX),
        "tokens_in": i(A.GEN_AI_USAGE_INPUT_TOKENS) or 0,
        "tokens_out": i(A.GEN_AI_USAGE_OUTPUT_TOKENS) or 0,
        "tokens_cached": i(A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS) or 0,
    }


def _vllm(reader: _Reader) -> dict[str, Any]:
    d = reader.double
    return {
        "model": reader.first("string", A.GEN_AI_RESPONSE_MODEL, A.GEN_AI_REQUEST_MODEL),
        "e2e_s": d(A.VLLM_LATENCY_E2E), "ttft_s": d(A.VLLM_LATENCY_TTFT),
        "queue_s": d(A.VLLM_LATENCY_QUEUE), "prefill_s": d(A.VLLM_LATENCY_PREFILL),
        "decode_s": d(A.VLLM_LATENCY_DECODE),
        "tokens_in": reader.first("int", A.GEN_AI_USAGE_INPUT_TOKENS, A.VLLM_USAGE_PROMPT_TOKENS) or 0,
        "tokens_out": reader.first("int", A.GEN_AI_USAGE_OUTPUT_TOKENS, A.VLLM_USAGE_COMPLETION_TOKENS) or 0,
        "tokens_cached": reader.integer(A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS) or 0,
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


# RequestRecord(**fields).to_dict() without the dataclass: its fields in order, with their defaults (the
# required ones, None here, are always set). A copy updated with the fields keeps this order, so the JSON
# is byte for byte the same.
_RECORD_TEMPLATE: dict[str, Any] = {
    f.name: None if f.default is MISSING else f.default for f in dataclass_fields(RequestRecord)}
_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16
_INF = float("inf")


def _surely_valid(r: dict[str, Any]) -> bool:
    """True only when ``validate(r)`` would find nothing, for a record built by ``_record_fields``: the
    contract's checks, minus what building the record guarantees (times set and ordered, region a short
    string, model a string or None, ids lowercase hex, no other keys). A seventh of ``validate``'s cost;
    ``validate`` stays the judge: whatever this does not accept goes to it, and it words the problems."""
    e2e = r["e2e_s"]
    if (type(e2e) is not float or not 0.0 <= e2e <= (r["end_ns"] - r["start_ns"]) / NS + _SLACK_S
            or len(r["trace_id"]) != 32 or r["trace_id"] == _ZERO_TRACE_ID
            or not r["model"] or r["track"] not in A.TRACKS or r["finish_reason"] not in FINISH_REASONS):
        return False
    span_id = r["span_id"]
    if span_id and (len(span_id) != 16 or span_id == _ZERO_SPAN_ID):
        return False
    limit = e2e + _SLACK_S
    for name in ("ttft_s", "queue_s", "prefill_s", "decode_s"):
        value = r[name]
        if value is not None and not (type(value) is float and 0.0 <= value <= limit):
            return False
    low = 0.0  # itl percentiles: each finite, non-negative, and none below the one before
    for name in ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s"):
        value = r[name]
        if value is not None:
            if not (type(value) is float and low <= value < _INF):
                return False
            low = value
    mean, count, tokens_in, tokens_out, cached = (r["itl_mean_s"], r["itl_count"], r["tokens_in"],
                                                  r["tokens_out"], r["tokens_cached"])
    if mean is not None and not (type(mean) is float and 0.0 <= mean < _INF):
        return False
    if not (type(count) is int and type(tokens_in) is int and type(tokens_out) is int and type(cached) is int
            and count >= 0 and tokens_out >= 0 and 0 <= cached <= tokens_in):
        return False
    if (count > 0 and mean is None) or (tokens_out > 0 and r["ttft_s"] is None):
        return False
    error = r["error_type"]
    return error is None or (type(error) is str and error != "")


def _record_fields(span: Span, source: str, attrs: Mapping[str, AnyValue], resource: dict[str, Any],
                   now_ns: int, bounds: TimeBounds) -> dict[str, Any] | list[str]:
    """``span_to_record``'s work for a request-level span of ``source``, with the record as its
    ``to_dict()``; ``attrs`` maps each attribute key to its AnyValue."""
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
    fields = _common(reader, span, _ENGINE_DEFAULTS[source])
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
    record = _RECORD_TEMPLATE.copy()
    record.update(fields)
    record.update(trace_id=span.trace_id.hex(), span_id=span.span_id.hex(), start_ns=start, end_ns=end)
    if _surely_valid(record):
        return record
    return validate(record) or record


def span_to_record(span: Span, resource: dict[str, Any], now_ns: int, bounds: TimeBounds
                   ) -> RequestRecord | list[str] | None:
    """The record of one request-level span, its problems, or None when the span is not request-level."""
    attrs = {kv.key: kv.value for kv in span.attributes}
    source = source_of(span, attrs)
    if source is None:
        return None
    result = _record_fields(span, source, attrs, resource, now_ns, bounds)
    return RequestRecord(**result) if isinstance(result, dict) else result


def _rejected(request: ExportTraceServiceRequest, at: tuple[int, int, int], problems: list[str]) -> Rejected:
    """The span at ``at`` (resource, scope, span index) alone, with its resource and scope."""
    resource_spans = request.resource_spans[at[0]]
    scope_spans = resource_spans.scope_spans[at[1]]
    span = scope_spans.spans[at[2]]
    single = ExportTraceServiceRequest()
    rs = single.resource_spans.add()
    rs.resource.CopyFrom(resource_spans.resource)
    ss = rs.scope_spans.add()
    ss.scope.CopyFrom(scope_spans.scope)
    ss.spans.add().CopyFrom(span)
    return Rejected(problems, single.SerializeToString(), span.trace_id.hex())


def record_dicts_from_payload(payload: bytes, now_ns: int, bounds: TimeBounds | None = None
                              ) -> Iterator[dict[str, Any] | Rejected]:
    """``records_from_payload`` with each record as its ``RequestRecord.to_dict()``, built directly: what
    the normaliser writes, without a dataclass per request only to turn it back into a dict.

    Raises ``google.protobuf.message.DecodeError`` when the bytes are not an OTLP trace request."""
    bounds = bounds or TimeBounds()
    request: ExportTraceServiceRequest | None = None  # the contract's own type: parsed only when needed
    try:
        view = TracesView.FromString(payload)  # attributes as maps: see TracesView
    except DecodeError:
        view = None
    if view is None:  # raise the contract type's own error; should it parse after all, read it instead
        request = ExportTraceServiceRequest.FromString(payload)
    message: Any = request if view is None else view
    for i, resource_spans in enumerate(message.resource_spans):
        resource = {kv.key: any_value(kv.value) for kv in resource_spans.resource.attributes}
        for j, scope_spans in enumerate(resource_spans.scope_spans):
            for k, span in enumerate(scope_spans.spans):
                if view is not None and not UnknownFieldSet(span):
                    attrs = span.attributes
                else:  # see TracesView: this span's attributes need the KeyValue list
                    if request is None:
                        request = ExportTraceServiceRequest.FromString(payload)
                    span = request.resource_spans[i].scope_spans[j].spans[k]
                    attrs = {kv.key: kv.value for kv in span.attributes}
                source = source_of(span, attrs)
                if source is None:  # not request-level: skipped (the full-trace topic carries them)
                    continue
                result = _record_fields(span, source, attrs, resource, now_ns, bounds)
                if isinstance(result, dict):
                    yield result
                    continue
                if request is None:
                    request = ExportTraceServiceRequest.FromString(payload)
                yield _rejected(request, (i, j, k), result)


def records_from_payload(payload: bytes, now_ns: int, bounds: TimeBounds | None = None
                         ) -> Iterator[RequestRecord | Rejected]:
    """Every request-level span of one OTLP trace batch, as a record or a rejection.

    Raises ``google.protobuf.message.DecodeError`` when the bytes are not an OTLP trace request."""
    for item in record_dicts_from_payload(payload, now_ns, bounds):
        yield item if isinstance(item, Rejected) else RequestRecord(**item)
