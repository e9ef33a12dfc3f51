"""Delivery of pre-encoded OTLP to the regional gateways over gRPC, one sender thread per region.

Like a pod's exporter it retries a refused or failed export (gateway restarting, memory limiter
pushing back) until it goes through, so nothing the simulator counted is lost on the way in; unlike
the SDK's batch processor it never drops when its queue is full: the producer waits instead (so an
overloaded pipeline shows up as the simulator falling behind its schedule, not as silent loss)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

_log = logging.getLogger(__name__)
TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
METRICS = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


@dataclass
class SenderStats:
    exports: int = 0
    retries: int = 0
    rejected: int = 0       # spans/points a gateway accepted the call for but reported rejected
    bytes: int = 0
    last_error: str = ""
    queued: int = 0
    dropped: int = 0        # exports abandoned because close() came before they went through


@dataclass
class _Region:
    endpoint: str
    queue: queue.Queue
    stats: SenderStats = field(default_factory=SenderStats)
    thread: threading.Thread | None = None


class Exporter:
    """``submit(region, kind, payload)``; ``flush()`` waits until everything submitted is acknowledged."""

    def __init__(self, endpoints: dict[str, str], max_queued: int = 2000, timeout_s: float = 10.0) -> None:
        self._regions = {r: _Region(e, queue.Queue(max_queued)) for r, e in endpoints.items()}
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        for region, state in self._regions.items():
            state.thread = threading.Thread(target=self._run, args=(region, state), daemon=True,
                                            name=f"otlp-{region}")
            state.thread.start()

    def submit(self, region: str, kind: str, payload: bytes) -> None:
        state = self._regions.get(region)
        if state is None:
            raise KeyError(f"no gateway endpoint for region {region!r} (have {sorted(self._regions)})")
        state.queue.put((kind, payload))  # blocks while the region's queue is full: back-pressure

    def backlog(self) -> int:
        return sum(s.queue.unfinished_tasks for s in self._regions.values())

    def stats(self) -> dict[str, SenderStats]:
        for state in self._regions.values():
            state.stats.queued = state.queue.unfinished_tasks
        return {r: s.stats for r, s in self._regions.items()}

    def flush(self, timeout_s: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.backlog() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.backlog() == 0

    def close(self) -> None:
        self._stop.set()
        for state in self._regions.values():
            state.queue.put(None)
        for state in self._regions.values():
            if state.thread is not None:
                state.thread.join(timeout=5)

    def _run(self, region: str, state: _Region) -> None:
        channel = grpc.insecure_channel(state.endpoint, options=[("grpc.max_send_message_length", 64 << 20)])
        calls = {"traces": channel.unary_unary(TRACES), "metrics": channel.unary_unary(METRICS)}
        while True:
            item = state.queue.get()
            if item is None:
                state.queue.task_done()
                break
            kind, payload = item
            delay = 0.2
            while True:
                try:
                    response = calls[kind](payload, timeout=self._timeout_s, wait_for_ready=True)
                    state.stats.rejected += _rejected(kind, response)
                    state.stats.exports += 1
                    state.stats.bytes += len(payload)
                    break
                except grpc.RpcError as exc:
                    if self._stop.is_set() and state.queue.qsize() == 0:
                        _log.warning("%s: giving up on an export at shutdown: %s", region, exc.code())
                        state.stats.dropped += 1
                        break
                    state.stats.retries += 1
                    state.stats.last_error = f"{exc.code().name}: {exc.details()}"
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
            state.queue.task_done()
        channel.close()


def _rejected(kind: str, response: bytes) -> int:
    if not response:
        return 0
    if kind == "traces":
        return ExportTraceServiceResponse.FromString(response).partial_success.rejected_spans
    return ExportMetricsServiceResponse.FromString(response).partial_success.rejected_data_points
