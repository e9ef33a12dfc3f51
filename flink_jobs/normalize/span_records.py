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
from infersight.schemas.contract import BY_NAME, REQUEST_FIELDS
from infersight.schemas.records import FINISH_REASONS, RequestRecord, surely_valid, validate
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


# Our root span's numbers, field -> attribute, from the contract's table (counts default to 0).
_OUR_DOUBLES = tuple((f.name, f.attribute) for f in REQUEST_FIELDS if f.type == "double" and f.attribute)
_OUR_COUNTS = tuple((f.name, f.attribute) for f in REQUEST_FIELDS
                    if f.type == "int" and f.attribute and not f.on_resource)
_MODEL = BY_NAME["model"]


def _ours(reader: _Reader) -> dict[str, Any]:
    d, i = reader.double, reader.integer
    fields: dict[str, Any] = {"model": reader.string(_MODEL.attribute, MAX_DIMENSION_CHARS)}
    for name, attribute in _OUR_DOUBLES:
        fields[name] = d(attribute)
    for name, attribute in _OUR_COUNTS:
        fields[name] = i(attribute) or 0
    return fields


# vLLM's llm_request span: its own spellings of the durations and token counts (the contract's vllm column).
_VLLM_DOUBLES = tuple((f.name, f.vllm[0]) for f in REQUEST_FIELDS if f.type == "double" and f.vllm)
_VLLM_COUNTS = tuple((f.name, (f.attribute, *f.vllm)) for f in REQUEST_FIELDS if f.type == "int" and f.vllm)
_CACHED = BY_NAME["tokens_cached"].attribute


def _vllm(reader: _Reader) -> dict[str, Any]:
    d = reader.double
    fields: dict[str, Any] = {"model": reader.first("string", *_MODEL.vllm, _MODEL.attribute)}  # response first
    for name, attribute in _VLLM_DOUBLES:
        fields[name] = d(attribute)
    for name, attributes in _VLLM_COUNTS:
        fields[name] = reader.first("int", *attributes) or 0
    fields["tokens_cached"] = reader.integer(_CACHED) or 0
    return fields


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
    if surely_valid(record):
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


def record_dicts_from_payload(payload: bytes, now_ns: int, bounds: TimeBounds | None = None,
                              parents: dict[tuple[str, str], str] | None = None
                              ) -> Iterator[dict[str, Any] | Rejected]:
    """``records_from_payload`` with each record as its ``RequestRecord.to_dict()``, built directly: what
    the normaliser writes, without a dataclass per request only to turn it back into a dict. With
    ``parents``, each record whose span has a parent gets ``(trace id, span id) -> parent span id`` there
    (the client-call join's server half, ``client_calls``).

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
                    if parents is not None and span.parent_span_id:
                        parents[(result["trace_id"], result["span_id"])] = span.parent_span_id.hex()
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
