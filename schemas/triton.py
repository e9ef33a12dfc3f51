"""Triton Inference Server's names, understood on input, and the names of our Triton adapter.

Triton's OpenTelemetry trace mode (``--trace-config mode=opentelemetry``, level TIMESTAMPS) records each
request's timestamps as span events named ``REQUEST_START`` ... ``REQUEST_END`` (the same names and
nanosecond values as its JSON trace file). :func:`stage_durations` turns such a list into our stages:

    queue          QUEUE_START          -> COMPUTE_START         (our ``queue`` stage)
    compute        COMPUTE_START        -> COMPUTE_END           (prefill + decode; Triton cannot split them)
    compute_input  COMPUTE_START        -> COMPUTE_INPUT_END     (input copy, e.g. host to GPU)
    compute_infer  COMPUTE_INPUT_END    -> COMPUTE_OUTPUT_START  (the model itself)
    compute_output COMPUTE_OUTPUT_START -> COMPUTE_END           (output copy)
    request        REQUEST_START        -> REQUEST_END           (Triton's request handling, e2e on the server)
    overhead       request - queue - compute

Triton's Prometheus families (``nv_*``) are mapped by :data:`TRITON_METRICS`. The entries here are not in
``schemas.registry`` (whose file belongs to the contract's owner); :data:`ENTRIES` is the list to merge there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.spec import Entry, Instrument, Kind, Source
from infersight.schemas.units import NS

# --- Triton's span event names (OpenTelemetry trace mode, TIMESTAMPS level) ---
REQUEST_START = "REQUEST_START"
QUEUE_START = "QUEUE_START"
COMPUTE_START = "COMPUTE_START"
COMPUTE_INPUT_END = "COMPUTE_INPUT_END"
COMPUTE_OUTPUT_START = "COMPUTE_OUTPUT_START"
COMPUTE_END = "COMPUTE_END"
REQUEST_END = "REQUEST_END"
TRITON_EVENTS = (REQUEST_START, QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END,
                 REQUEST_END)

# Triton stage -> (start event, end event). "queue" is our queue stage; "compute" is prefill + decode.
STAGE_INTERVALS: Mapping[str, tuple[str, str]] = {
    "queue": (QUEUE_START, COMPUTE_START),
    "compute": (COMPUTE_START, COMPUTE_END),
    "compute_input": (COMPUTE_START, COMPUTE_INPUT_END),
    "compute_infer": (COMPUTE_INPUT_END, COMPUTE_OUTPUT_START),
    "compute_output": (COMPUTE_OUTPUT_START, COMPUTE_END),
    "request": (REQUEST_START, REQUEST_END),
}

# --- Triton's span attributes (on its model spans) ---
TRITON_MODEL_NAME = "model_name"
TRITON_MODEL_VERSION = "model_version"
TRITON_REQUEST_ID = "request_id"
TRITON_PARENT_ID = "parent_id"

# --- Triton's Prometheus families (the three in schemas.metrics plus the rest we read) ---
NV_INFERENCE_REQUEST_SUCCESS = "nv_inference_request_success"
NV_INFERENCE_REQUEST_FAILURE = "nv_inference_request_failure"
NV_INFERENCE_COUNT = "nv_inference_count"
NV_INFERENCE_EXEC_COUNT = "nv_inference_exec_count"
NV_INFERENCE_PENDING_REQUEST_COUNT = "nv_inference_pending_request_count"
NV_INFERENCE_COMPUTE_INPUT_DURATION_US = "nv_inference_compute_input_duration_us"
NV_INFERENCE_COMPUTE_INFER_DURATION_US = "nv_inference_compute_infer_duration_us"
NV_INFERENCE_COMPUTE_OUTPUT_DURATION_US = "nv_inference_compute_output_duration_us"
NV_INFERENCE_FIRST_RESPONSE_HISTOGRAM_MS = "nv_inference_first_response_histogram_ms"
NV_GPU_MEMORY_USED_BYTES = "nv_gpu_memory_used_bytes"
NV_GPU_MEMORY_TOTAL_BYTES = "nv_gpu_memory_total_bytes"

# --- semconv attributes on our Triton client spans ---
RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"
RPC_METHOD = "rpc.method"
RPC_GRPC_STATUS_CODE = "rpc.grpc.status_code"
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
KSERVE_SERVICE = "inference.GRPCInferenceService"  # the KServe v2 gRPC service Triton implements

# --- ours: the Triton adapter ---
TRITON_PROTOCOL = "infersight.triton.protocol"           # http | grpc
TRITON_MODEL_VERSION_ATTR = "infersight.triton.model.version"
TRITON_BATCH_SIZE = "infersight.triton.batch.size"
TRITON_EXECUTE_STAGE = "execute"                          # value of infersight.stage on Python-backend spans
TRITON_EXECUTE_DURATION = "infersight.triton.execute.duration"
TRITON_EXECUTE_BATCH = "infersight.triton.execute.batch_size"
TRITON_CLIENT_DURATION = M.GEN_AI_CLIENT_OPERATION_DURATION  # client-observed: never a server metric
STAGE_ATTRIBUTES: Mapping[str, str] = {
    "queue": A.QUEUE_DURATION,
    "compute": "infersight.triton.compute.duration",
    "compute_input": "infersight.triton.compute_input.duration",
    "compute_infer": "infersight.triton.compute_infer.duration",
    "compute_output": "infersight.triton.compute_output.duration",
    "request": A.E2E,
    "overhead": "infersight.triton.overhead.duration",
}
EXECUTE_BUCKETS = M.QUEUE_BUCKETS[:-2] + (30.0, 60.0)  # 0.5 ms .. 60 s, like queue time
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


@dataclass(frozen=True)
class TritonMetric:
    """How one ``nv_*`` family maps onto ours: ``value * scale`` is in ``ours``' unit."""

    name: str
    ours: str
    scale: float
    kind: str  # "cumulative_sum" (divide deltas by a request-count delta for a mean), "counter", "gauge", ...
    note: str = ""


TRITON_METRICS: Mapping[str, TritonMetric] = {m.name: m for m in (
    TritonMetric(M.TRITON_QUEUE_DURATION_US, M.QUEUE_TIME_METRIC, 1e-6, "cumulative_sum",
                 "sum of queue time of all requests; mean = delta / delta(nv_inference_request_success)"),
    TritonMetric(M.TRITON_REQUEST_DURATION_US, M.GEN_AI_SERVER_REQUEST_DURATION, 1e-6, "cumulative_sum",
                 "sum of request time; mean = delta / delta(nv_inference_request_success)"),
    TritonMetric(NV_INFERENCE_COMPUTE_INPUT_DURATION_US, STAGE_ATTRIBUTES["compute_input"], 1e-6,
                 "cumulative_sum"),
    TritonMetric(NV_INFERENCE_COMPUTE_INFER_DURATION_US, STAGE_ATTRIBUTES["compute_infer"], 1e-6,
                 "cumulative_sum"),
    TritonMetric(NV_INFERENCE_COMPUTE_OUTPUT_DURATION_US, STAGE_ATTRIBUTES["compute_output"], 1e-6,
                 "cumulative_sum"),
    TritonMetric(NV_INFERENCE_REQUEST_SUCCESS, "infersight.triton.requests.success", 1.0, "counter"),
    TritonMetric(NV_INFERENCE_REQUEST_FAILURE, "infersight.triton.requests.failure", 1.0, "counter"),
    TritonMetric(NV_INFERENCE_COUNT, "infersight.triton.inferences", 1.0, "counter",
                 "batched inferences: one request of batch size 8 counts 8"),
    TritonMetric(NV_INFERENCE_EXEC_COUNT, "infersight.triton.executions", 1.0, "counter",
                 "model executions: nv_inference_count / nv_inference_exec_count is the mean batch size"),
    TritonMetric(NV_INFERENCE_PENDING_REQUEST_COUNT, M.QUEUE_DEPTH, 1.0, "gauge"),
    TritonMetric(NV_INFERENCE_FIRST_RESPONSE_HISTOGRAM_MS, "infersight.triton.first_response.duration", 1e-3,
                 "histogram", "first response (first chunk), not first token: never mapped to TTFT"),
    TritonMetric(M.TRITON_GPU_UTILIZATION, M.HW_GPU_UTILIZATION, 1.0, "gauge", "0-1 in both"),
    TritonMetric(NV_GPU_MEMORY_USED_BYTES, M.HW_GPU_MEMORY_USAGE, 1.0, "gauge"),
    TritonMetric(NV_GPU_MEMORY_TOTAL_BYTES, M.HW_GPU_MEMORY_LIMIT, 1.0, "gauge"),
)}


def normalise_metric(name: str, value: Any) -> tuple[str, float] | None:
    """``(our name, value in our unit)`` for a Triton family, None for unknown names or non-numbers."""
    spec = TRITON_METRICS.get(name) if isinstance(name, str) else None
    if spec is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return spec.ours, value * spec.scale


@dataclass(frozen=True)
class StageTimings:
    """Stage durations in seconds from one request's Triton timestamps, plus what was wrong with the input."""

    durations: dict[str, float] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def attributes(self) -> dict[str, float]:
        """The durations under our span-attribute names (``infersight.stage.queue.duration``, ...)."""
        return {STAGE_ATTRIBUTES[k]: v for k, v in self.durations.items()}


def stage_durations(events: Iterable[Any]) -> StageTimings:
    """Turn ``[(event name, timestamp ns), ...]`` (Triton's span events) into stage durations in seconds.

    Pure and total: unknown names are ignored, malformed entries, repeated events and intervals that
    run backwards are reported in ``problems`` and left out; it never raises. For a repeated event the
    first timestamp counts (an ensemble's composing models repeat them on their own spans).
    """
    problems: list[str] = []
    stamps: dict[str, int] = {}
    try:
        items = list(events)
    except TypeError:
        return StageTimings({}, (f"events must be a list of (name, timestamp_ns), got {type(events).__name__}",))
    for item in items:
        try:
            name, ts = item
        except (TypeError, ValueError):
            problems.append(f"not a (name, timestamp_ns) pair: {item!r}")
            continue
        if name not in TRITON_EVENTS:
            continue
        if isinstance(ts, bool) or not isinstance(ts, int | float) or ts < 0:
            problems.append(f"{name}: timestamp {ts!r} is not a non-negative number of nanoseconds")
            continue
        if name in stamps:
            problems.append(f"{name} repeated; the first one counts")
            continue
        stamps[name] = int(ts)
    durations: dict[str, float] = {}
    for stage, (start, end) in STAGE_INTERVALS.items():
        if start in stamps and end in stamps:
            delta = stamps[end] - stamps[start]
            if delta < 0:
                problems.append(f"{stage}: {end} is {-delta} ns before {start}")
            else:
                durations[stage] = delta / NS
    if {"request", "queue", "compute"} <= durations.keys():
        overhead = durations["request"] - durations["queue"] - durations["compute"]
        if overhead >= 0:
            durations["overhead"] = overhead
        else:
            problems.append("queue + compute exceed the request duration")
    return StageTimings(durations, tuple(problems))


_T, _US = Source.TRITON, Source.INFERSIGHT
_SEM = Source.SEMCONV


def _read_metric(m: TritonMetric) -> Entry:
    inst = {"gauge": Instrument.GAUGE, "histogram": Instrument.HISTOGRAM}.get(m.kind, Instrument.COUNTER)
    return Entry(m.name, Kind.METRIC, "double", _T, f"Triton's own family ({m.kind}), read and mapped. {m.note}",
                 unit="", cardinality="Triton's labels (model, version, gpu_uuid)", instrument=inst, emitted=False,
                 maps_to=f"{m.ours} (x{m.scale:g})")


ENTRIES: tuple[Entry, ...] = (
    *(Entry(name, Kind.EVENT, "span event", _T, "Triton timestamp event on its OpenTelemetry spans.",
            emitted=False, maps_to="stage durations (schemas.triton.stage_durations)") for name in TRITON_EVENTS),
    *(_read_metric(m) for m in TRITON_METRICS.values()
      if m.name not in (M.TRITON_QUEUE_DURATION_US, M.TRITON_REQUEST_DURATION_US, M.TRITON_GPU_UTILIZATION)),
    Entry(TRITON_PROTOCOL, Kind.SPAN, "string", _US, "KServe v2 protocol of a Triton client call: http or grpc.",
          cardinality="2 values"),
    Entry(TRITON_MODEL_VERSION_ATTR, Kind.SPAN, "string", _US, "Model version requested from Triton.",
          cardinality="low"),
    Entry(TRITON_BATCH_SIZE, Kind.SPAN, "int", _US, "Requests in the Python-backend execute() batch.",
          unit="{request}"),
    *(Entry(v, Kind.SPAN, "double", _US, f"Triton {k} duration from its timestamps.", unit="s")
      for k, v in STAGE_ATTRIBUTES.items() if v.startswith("infersight.triton.")),
    Entry(TRITON_EXECUTE_DURATION, Kind.METRIC, "double", _US,
          "Duration of one Python-backend execute() call (the whole batch).", unit="s",
          cardinality="gen_ai.request.model, error.type", instrument=Instrument.HISTOGRAM, buckets=EXECUTE_BUCKETS,
          buckets_why="like queue time: 0.5 ms resolution around the TTFT SLO, up to 60 s"),
    Entry(TRITON_EXECUTE_BATCH, Kind.METRIC, "int", _US, "Requests per Python-backend execute() call.",
          unit="{request}", cardinality="gen_ai.request.model", instrument=Instrument.HISTOGRAM,
          buckets=BATCH_BUCKETS, buckets_why="powers of two, Triton's usual max_batch_size values"),
)
