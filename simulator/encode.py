"""Simulated requests -> the OTLP our instrumentation exports (``instrumentation.summary.root_attributes``
and ``spans``): a root span per request (record-only when the trace is sampled out; with queue, prefill
and decode stage spans when it is sampled), and per-pod gauges. The numbers are derived from integer
nanoseconds with the SDK's own expressions, so both decode to identical records. The bytes are written
with the shared wire primitives (``infersight.schemas.otlp_wire``) from templates built once: per pod its
resource and the root span's fixed attributes, per attribute its key (named by the contract's table)."""

from __future__ import annotations

import struct
from collections import defaultdict

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas import otlp_wire as w
from infersight.schemas import pipeline as P
from infersight.schemas import quality as Q
from infersight.schemas.attributes import SCOPE_NAME, SCOPE_VERSION
from infersight.schemas.contract import BY_NAME, ITL_FIELDS
from infersight.schemas.evaluation import LATE_EVALUATION_SPAN
from infersight.schemas.metrics import GEN_AI_EVALUATION_RESULT
from infersight.schemas.otlp_wire import SPAN_ATTRIBUTE, field, key_value
from infersight.schemas.pipeline import GPU_COUNT_ATTRIBUTE, GPU_TYPE_ATTRIBUTE
from infersight.schemas.units import NS
from infersight.simulator.workload import ALL_ERRORS, Pod, Tick

_NS_F = float(NS)  # seconds = ns / 1e9, as the instrumentation computes them (a float divisor: the cheaper division)
ENGINE = "vllm"
OPERATION = "chat"
SERVICE_PREFIX = "llm-serving"
MAX_SPANS_PER_EXPORT = 2000  # keeps each export well under the receiver's 4 MiB gRPC message limit
_STAGE_NAMES = ("queue", "prefill", "decode")
JUDGE_DELAY_NS = 20_000_000  # a result's time after its request's end (the judges run beside serving)


def _attribute(record_field: str) -> str:
    """The root span attribute that carries ``record_field`` (the contract's table)."""
    attribute = BY_NAME[record_field].attribute
    assert attribute is not None, record_field
    return attribute


def _double(record_field: str) -> w.DoubleAttr:
    return w.DoubleAttr(SPAN_ATTRIBUTE, _attribute(record_field))


def _span_attribute(key: str, value: object) -> bytes:
    return field(SPAN_ATTRIBUTE, key_value(key, value))


_E2E, _TTFT, _TPOT = _double("e2e_s"), _double("ttft_s"), w.DoubleAttr(SPAN_ATTRIBUTE, A.TPOT)  # TPOT: no record field
_QUEUE, _PREFILL, _DECODE = _double("queue_s"), _double("prefill_s"), _double("decode_s")
_ITL_COUNT = w.IntAttr(SPAN_ATTRIBUTE, _attribute(ITL_FIELDS[0].name))
_ITL = tuple(_double(f.name) for f in ITL_FIELDS[1:])  # mean, p50, p90, p99, max
_IN, _OUT = w.IntAttr(SPAN_ATTRIBUTE, _attribute("tokens_in")), w.IntAttr(SPAN_ATTRIBUTE, _attribute("tokens_out"))
_CACHED = w.IntAttr(SPAN_ATTRIBUTE, _attribute("tokens_cached"))
_RECORD_ONLY = _span_attribute(A.RECORD_ONLY, True)
_FINISH = {r: _span_attribute(_attribute("finish_reason"), (r,)) for r in ("stop", "length", "error")}
_ERRORS = tuple(_span_attribute(_attribute("error_type"), e) + w.error_status(e) for e in ALL_ERRORS)
_STAGE_SPAN = tuple(w.span_head(n, w.KIND_INTERNAL) + _span_attribute(A.STAGE, n) for n in _STAGE_NAMES)


def resource_attributes(pod: Pod) -> dict[str, str | int]:
    """The pod's OTLP resource, as ``instrumentation.config.build_resource`` + the pod's environment set it."""
    return {A.SERVICE_NAME: f"{SERVICE_PREFIX}-{pod.model.name}", A.K8S_POD_NAME: pod.name,
            A.CLOUD_REGION: pod.region.name, A.DEPLOYMENT_TRACK: pod.track, A.MODEL_VERSION: pod.version,
            P.POD_MODEL_ATTRIBUTE: pod.model.name,  # a pod serves one model: its gauges and cost roll up per model
            A.ENGINE: ENGINE, GPU_TYPE_ATTRIBUTE: pod.region.gpu_type, GPU_COUNT_ATTRIBUTE: pod.model.gpus_per_pod}


_SCOPE = field(w.SCOPE_SPANS_SCOPE, w.scope(SCOPE_NAME, SCOPE_VERSION))


class PodTemplate:
    """A pod's constant bytes: resource, and the root span's name, kind and fixed attributes."""

    __slots__ = ("evaluation_head", "resource", "root_head")

    def __init__(self, pod: Pod) -> None:
        self.resource = field(w.RESOURCE_SPANS_RESOURCE, w.resource(resource_attributes(pod)))
        fixed = {A.GEN_AI_PROVIDER_NAME: ENGINE, _attribute("engine"): ENGINE, _attribute("track"): pod.track,
                 _attribute("model_version"): pod.version, A.GEN_AI_OPERATION_NAME: OPERATION,
                 _attribute("model"): pod.model.name}
        self.root_head = (w.span_head(f"{OPERATION} {pod.model.name}", w.KIND_SERVER)
                          + b"".join(_span_attribute(k, v) for k, v in fixed.items()))
        # a late evaluation's child span: the request's series, as ``Instrumentation.emit_late_evaluation``
        self.evaluation_head = (w.span_head(LATE_EVALUATION_SPAN, w.KIND_INTERNAL) + b"".join(
            _span_attribute(k, v) for k, v in {A.GEN_AI_REQUEST_MODEL: pod.model.name, A.MODEL_VERSION: pod.version,
                                               A.DEPLOYMENT_TRACK: pod.track}.items()))


class Encoder:
    """Encodes ticks for one fleet (templates built once per pod)."""

    def __init__(self, pods: list[Pod], judge_rate: float = 0.0) -> None:
        self.pods, self.judge_rate = pods, judge_rate
        self.templates = [PodTemplate(p) for p in pods]

    def spans(self, tick: Tick) -> dict[str, list[bytes]]:
        """Per region, ``ExportTraceServiceRequest`` payloads holding the tick's spans."""
        by_pod: dict[int, list[bytes]] = defaultdict(list)
        cols = (tick.pod.tolist(), tick.end_ns.tolist(), tick.queue_ns.tolist(), tick.prefill_ns.tolist(),
                tick.decode_ns.tolist(), tick.tail_ns.tolist(), tick.tokens_in.tolist(),
                tick.tokens_cached.tolist(), tick.tokens_out.tolist(), tick.gap_ns.tolist(), tick.error.tolist(),
                tick.sampled.tolist())
        tids, sids = tick.trace_ids, tick.span_ids
        templates, span_field = self.templates, w.SCOPE_SPANS_SPAN
        rows = enumerate(zip(*cols, strict=True))
        for i, (pod, end, q, p, d, tail, t_in, t_cached, t_out, gaps, err, sampled) in rows:
            tid, sid = tids[16 * i:16 * i + 16], sids[8 * i:8 * i + 8]
            start = end - (q + p + (d if t_out > 0 else 0) + tail)
            root = root_span(templates[pod].root_head, tid, sid, start, end, q, p, d, t_in, t_cached, t_out,
                             gaps, err, sampled)
            out = by_pod[pod]
            out.append(field(span_field, root))
            if sampled:
                out.extend(field(span_field, s) for s in stage_spans(tid, sid, start, q, p, d, t_out))
        for i in (tick.judged.nonzero()[0].tolist() if len(tick.judged) else ()):
            pod = int(tick.pod[i])
            results = ((Q.RELEVANCE, float(tick.relevance[i]),
                        "relevant" if tick.relevance[i] >= Q.PASS_THRESHOLD else "irrelevant"),
                       _flag(Q.REFUSAL, bool(tick.refused[i])), _flag(Q.PII, bool(tick.pii[i])))
            by_pod[pod].extend(field(span_field, s) for s in evaluation_spans(
                templates[pod].evaluation_head, tids[16 * i:16 * i + 16], sids[8 * i:8 * i + 8],
                int(tick.end_ns[i]), bool(tick.sampled[i]), self.judge_rate, results))
        return self._exports(by_pod)

    def _exports(self, by_pod: dict[int, list[bytes]]) -> dict[str, list[bytes]]:
        by_region: dict[str, list[bytes]] = defaultdict(list)
        pending: dict[str, list[bytes]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        for pod, spans in by_pod.items():
            region = self.pods[pod].region.name
            for lo in range(0, len(spans), MAX_SPANS_PER_EXPORT):
                chunk = spans[lo:lo + MAX_SPANS_PER_EXPORT]
                if counts[region] + len(chunk) > MAX_SPANS_PER_EXPORT and pending[region]:
                    by_region[region].append(b"".join(pending.pop(region)))
                    counts[region] = 0
                body = self.templates[pod].resource + field(w.RESOURCE_SPANS_SCOPE_SPANS, _SCOPE + b"".join(chunk))
                pending[region].append(field(w.REQUEST_RESOURCE_SPANS, body))
                counts[region] += len(chunk)
        for region, parts in pending.items():
            if parts:
                by_region[region].append(b"".join(parts))
        return by_region


def _doubles(*attrs: w.DoubleAttr):
    """One struct call for the span's start/end and a run of double attributes (prefixes as arguments)."""
    fmt = "<BQBQ" + "".join(f"{len(a.prefix)}sd" for a in attrs)
    return struct.Struct(fmt).pack, tuple(a.prefix for a in attrs)


# the three shapes of a root span's numbers: no token, one token, several tokens
_NONE = _doubles(_E2E, _QUEUE, _PREFILL)
_ONE = _doubles(_E2E, _QUEUE, _PREFILL, _TTFT, _DECODE)
_MANY = _doubles(_E2E, _QUEUE, _PREFILL, _TTFT, _DECODE, _TPOT, *_ITL)


def _pack(shape, start: int, end: int, *values: float) -> bytes:
    pack, prefixes = shape
    args: list = [0x39, start, 0x41, end]
    for prefix, value in zip(prefixes, values, strict=True):
        args += (prefix, value)
    return pack(*args)


def root_span(head: bytes, tid: bytes, sid: bytes, start: int, end: int, q: int, p: int, d: int, t_in: int,
              t_cached: int, t_out: int, gaps: list[int], err: int, sampled: bool) -> bytes:
    """The root span's bytes; values computed as the instrumentation's ``summarise`` computes them."""
    e2e, queue, prefill = (end - start) / _NS_F, q / _NS_F, p / _NS_F
    if t_out == 0:
        numbers = _pack(_NONE, start, end, e2e, queue, prefill)
        itl = b""
    elif t_out == 1:
        numbers = _pack(_ONE, start, end, e2e, queue, prefill, (q + p) / _NS_F, d / _NS_F)
        itl = b""
    else:
        n_gaps = t_out - 1
        mean = d / n_gaps / _NS_F
        numbers = _pack(_MANY, start, end, e2e, queue, prefill, (q + p) / _NS_F, d / _NS_F, mean, mean,
                        gaps[0] / _NS_F, gaps[1] / _NS_F, gaps[2] / _NS_F, gaps[3] / _NS_F)
        itl = _ITL_COUNT(n_gaps)
    parts = [w.SPAN_TRACE_ID, tid, w.SPAN_SPAN_ID, sid, head, numbers, itl, _IN(t_in), _OUT(t_out)]
    if t_cached:
        parts.append(_CACHED(t_cached))
    if err >= 0:
        parts += (_FINISH["error"], _ERRORS[err])
    else:
        parts.append(_FINISH["stop"])
    if not sampled:
        parts.append(_RECORD_ONLY)
    return b"".join(parts)


def stage_spans(tid: bytes, sid: bytes, start: int, q: int, p: int, d: int, t_out: int) -> list[bytes]:
    """queue, prefill and (with tokens) decode spans of a sampled trace, children of the root."""
    bounds = [(start, start + q), (start + q, start + q + p)]
    if t_out > 0:
        bounds.append((start + q + p, start + q + p + d))
    head = w.SPAN_TRACE_ID + tid
    parent = w.SPAN_PARENT_SPAN_ID + sid
    out = []
    for k, (s, e) in enumerate(bounds):
        child = sid[:7] + bytes([(sid[7] + k + 1) & 0xFF])
        out.append(b"".join((head, w.SPAN_SPAN_ID, child, parent, _STAGE_SPAN[k], w.span_times(s, e))))
    return out


def _flag(name: str, flagged: bool) -> tuple[str, float, str]:
    """A guardrail check's result, as ``instrumentation.evaluation.guardrails`` writes it."""
    return name, 1.0 if flagged else 0.0, "flagged" if flagged else "clear"


def evaluation_spans(head: bytes, tid: bytes, sid: bytes, end_ns: int, sampled: bool, sample_rate: float,
                     results: tuple[tuple[str, float, str], ...]) -> list[bytes]:
    """One late ``gen_ai.evaluation`` child span per result, each with its ``gen_ai.evaluation.result`` event
    (record-only when the trace was sampled out), as the instrumentation exports a judge's result that comes
    after its request finished. Span ids follow the stage spans' (root + 1..3)."""
    parent = w.SPAN_PARENT_SPAN_ID + sid
    out = []
    for k, (name, score, label) in enumerate(results):
        at = end_ns + (k + 1) * JUDGE_DELAY_NS
        child = sid[:7] + bytes([(sid[7] + 4 + k) & 0xFF])
        event = (w.EVENT_TIME + w.pack_fixed64(at) + field(w.EVENT_NAME, GEN_AI_EVALUATION_RESULT.encode())
                 + b"".join(field(w.EVENT_ATTRIBUTE, key_value(key, value)) for key, value in (
                     (A.GEN_AI_EVALUATION_NAME, name), (A.EVALUATION_SAMPLE_RATE, sample_rate),
                     (A.GEN_AI_EVALUATION_SCORE_VALUE, score), (A.GEN_AI_EVALUATION_SCORE_LABEL, label))))
        out.append(b"".join((w.SPAN_TRACE_ID, tid, w.SPAN_SPAN_ID, child, parent, head,
                             b"" if sampled else _RECORD_ONLY, w.span_times(at, at), field(w.SPAN_EVENT, event))))
    return out


def gauges(pods: list[Pod], values: dict[str, list[float]], time_ns: int, only: list[int] | None = None
           ) -> dict[str, bytes]:
    """Per region, an ``ExportMetricsServiceRequest`` with each pod's gauges (GPU ones per ``hw.id``)."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    requests: dict[str, ExportMetricsServiceRequest] = {}
    for i in (only if only is not None else range(len(pods))):
        pod = pods[i]
        req = requests.setdefault(pod.region.name, ExportMetricsServiceRequest())
        rm = req.resource_metrics.add()
        for key, value in resource_attributes(pod).items():
            v = AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)
            rm.resource.attributes.append(KeyValue(key=key, value=v))
        sm = rm.scope_metrics.add()
        sm.scope.name, sm.scope.version = SCOPE_NAME, SCOPE_VERSION
        for name, per_pod in values.items():
            metric = sm.metrics.add()
            metric.name = name
            gpu = name.startswith("hw.gpu.")
            for hw in range(pod.model.gpus_per_pod if gpu else 1):
                point = metric.gauge.data_points.add()
                point.time_unix_nano = time_ns
                point.as_double = float(per_pod[i])
                if gpu:
                    point.attributes.append(KeyValue(key=A.HW_ID, value=AnyValue(string_value=str(hw))))
    return {region: req.SerializeToString() for region, req in requests.items()}


GAUGES = (M.QUEUE_DEPTH, M.REQUESTS_RUNNING, M.KV_CACHE_USAGE, M.BATCH_SIZE, M.HW_GPU_UTILIZATION,
          M.HW_GPU_MEMORY_USAGE, M.HW_GPU_MEMORY_LIMIT)
