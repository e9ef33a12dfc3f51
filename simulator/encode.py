"""Simulated requests -> the OTLP our instrumentation exports (``instrumentation.summary.root_attributes``
and ``spans``): a root span per request (record-only when the trace is sampled out; with queue, prefill
and decode stage spans when it is sampled), and per-pod gauges. The numbers are derived from integer
nanoseconds with the SDK's own expressions, so both decode to identical records."""

from __future__ import annotations

import struct
from collections import defaultdict

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.instrumentation.spans import SCOPE_NAME, SCOPE_VERSION
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.pipeline import GPU_COUNT_ATTRIBUTE, GPU_TYPE_ATTRIBUTE
from infersight.simulator import otlp_wire as w
from infersight.simulator.workload import ALL_ERRORS, Pod, Tick

NS = 1e9  # as instrumentation.summary: seconds = ns / 1e9
ENGINE = "vllm"
OPERATION = "chat"
SERVICE_PREFIX = "llm-serving"
MAX_SPANS_PER_EXPORT = 2000  # keeps each export well under the receiver's 4 MiB gRPC message limit
_STAGE_NAMES = ("queue", "prefill", "decode")

_E2E, _TTFT, _TPOT = w.DoubleAttr(9, A.E2E), w.DoubleAttr(9, A.TTFT), w.DoubleAttr(9, A.TPOT)
_QUEUE, _PREFILL, _DECODE = (w.DoubleAttr(9, A.QUEUE_DURATION), w.DoubleAttr(9, A.PREFILL_DURATION),
                             w.DoubleAttr(9, A.DECODE_DURATION))
_ITL = tuple(w.DoubleAttr(9, k) for k in (A.ITL_MEAN, A.ITL_P50, A.ITL_P90, A.ITL_P99, A.ITL_MAX))
_IN, _OUT = w.IntAttr(9, A.GEN_AI_USAGE_INPUT_TOKENS), w.IntAttr(9, A.GEN_AI_USAGE_OUTPUT_TOKENS)
_CACHED, _ITL_COUNT = w.IntAttr(9, A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS), w.IntAttr(9, A.ITL_COUNT)
_RECORD_ONLY = w.field(9, w.kv_bool(A.RECORD_ONLY, True))
_FINISH = {r: w.field(9, w.kv_string_array(A.GEN_AI_RESPONSE_FINISH_REASONS, (r,))) for r in ("stop", "length",
                                                                                             "error")}
_ERRORS = tuple(w.field(9, w.kv_string(A.ERROR_TYPE, e)) + w.field(15, w.field(2, e.encode()) + b"\x18\x02")
                for e in ALL_ERRORS)
_STAGE_SPAN = tuple(w.field(5, n.encode()) + b"\x30\x01" + w.field(9, w.kv_string(A.STAGE, n))
                    for n in _STAGE_NAMES)


def resource_attributes(pod: Pod) -> dict[str, str | int]:
    """The pod's OTLP resource, as ``instrumentation.config.build_resource`` + the pod's environment set it."""
    return {A.SERVICE_NAME: f"{SERVICE_PREFIX}-{pod.model.name}", A.K8S_POD_NAME: pod.name,
            A.CLOUD_REGION: pod.region.name, A.DEPLOYMENT_TRACK: pod.track, A.MODEL_VERSION: pod.version,
            A.ENGINE: ENGINE, GPU_TYPE_ATTRIBUTE: pod.region.gpu_type, GPU_COUNT_ATTRIBUTE: pod.model.gpus_per_pod}


def _resource(pod: Pod) -> bytes:
    parts = []
    for key, value in resource_attributes(pod).items():
        kv = w.kv_int(key, value) if isinstance(value, int) else w.kv_string(key, value)
        parts.append(w.field(1, kv))
    return w.field(1, b"".join(parts))


_SCOPE = w.field(1, w.field(1, SCOPE_NAME.encode()) + w.field(2, SCOPE_VERSION.encode()))


class PodTemplate:
    """A pod's constant bytes: resource, and the root span's name, kind and fixed attributes."""

    __slots__ = ("resource", "root_head")

    def __init__(self, pod: Pod) -> None:
        self.resource = _resource(pod)
        fixed = {A.GEN_AI_PROVIDER_NAME: ENGINE, A.ENGINE: ENGINE, A.DEPLOYMENT_TRACK: pod.track,
                 A.MODEL_VERSION: pod.version, A.GEN_AI_OPERATION_NAME: OPERATION,
                 A.GEN_AI_REQUEST_MODEL: pod.model.name}
        self.root_head = (w.field(5, f"{OPERATION} {pod.model.name}".encode()) + b"\x30\x02"
                          + b"".join(w.field(9, w.kv_string(k, v)) for k, v in fixed.items()))


class Encoder:
    """Encodes ticks for one fleet (templates built once per pod)."""

    def __init__(self, pods: list[Pod]) -> None:
        self.pods = pods
        self.templates = [PodTemplate(p) for p in pods]

    def spans(self, tick: Tick) -> dict[str, list[bytes]]:
        """Per region, ``ExportTraceServiceRequest`` payloads holding the tick's spans."""
        by_pod: dict[int, list[bytes]] = defaultdict(list)
        cols = (tick.pod.tolist(), tick.end_ns.tolist(), tick.queue_ns.tolist(), tick.prefill_ns.tolist(),
                tick.decode_ns.tolist(), tick.tail_ns.tolist(), tick.tokens_in.tolist(),
                tick.tokens_cached.tolist(), tick.tokens_out.tolist(), tick.gap_ns.tolist(), tick.error.tolist(),
                tick.sampled.tolist())
        tids, sids = tick.trace_ids, tick.span_ids
        templates, field_ = self.templates, w.field
        rows = enumerate(zip(*cols, strict=True))
        for i, (pod, end, q, p, d, tail, t_in, t_cached, t_out, gaps, err, sampled) in rows:
            tid, sid = tids[16 * i:16 * i + 16], sids[8 * i:8 * i + 8]
            start = end - (q + p + (d if t_out > 0 else 0) + tail)
            root = root_span(templates[pod].root_head, tid, sid, start, end, q, p, d, t_in, t_cached, t_out,
                             gaps, err, sampled)
            out = by_pod[pod]
            out.append(field_(2, root))
            if sampled:
                out.extend(field_(2, s) for s in stage_spans(tid, sid, start, q, p, d, t_out))
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
                body = self.templates[pod].resource + w.field(2, _SCOPE + b"".join(chunk))
                pending[region].append(w.field(1, body))
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
    """The root span's bytes; values computed as ``RequestContext._summarise`` computes them."""
    e2e, queue, prefill = (end - start) / NS, q / NS, p / NS
    if t_out == 0:
        numbers = _pack(_NONE, start, end, e2e, queue, prefill)
        itl = b""
    elif t_out == 1:
        numbers = _pack(_ONE, start, end, e2e, queue, prefill, (q + p) / NS, d / NS)
        itl = b""
    else:
        n_gaps = t_out - 1
        mean = d / n_gaps / NS
        numbers = _pack(_MANY, start, end, e2e, queue, prefill, (q + p) / NS, d / NS, mean, mean,
                        gaps[0] / NS, gaps[1] / NS, gaps[2] / NS, gaps[3] / NS)
        itl = _ITL_COUNT(n_gaps)
    parts = [b"\x0a\x10", tid, b"\x12\x08", sid, head, numbers, itl, _IN(t_in), _OUT(t_out)]
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
    head = b"\x0a\x10" + tid
    parent = w.field(4, sid)
    out = []
    for k, (s, e) in enumerate(bounds):
        child = sid[:7] + bytes([(sid[7] + k + 1) & 0xFF])
        out.append(b"".join((head, b"\x12\x08", child, parent, _STAGE_SPAN[k], w.times(s, e))))
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
