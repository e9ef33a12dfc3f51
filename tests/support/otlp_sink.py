"""A minimal OTLP/gRPC receiver that accepts and counts spans and metric exports, for benchmarks and tests
that need a real endpoint without the collector stack. Run in-process (``OtlpSink().start()``) or as a
subprocess (``python -m tests.support.otlp_sink PORT``, from the repository root) to keep its CPU apart.
Test-only: it does not ship in the wheel."""

from __future__ import annotations

import sys
import threading
from concurrent import futures


class OtlpSink:
    def __init__(self, port: int = 0, keep: bool = False) -> None:
        import grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        sink = self
        self.spans = 0
        self.metric_exports = 0
        self.kept: list = []
        self.kept_metrics: list = []
        self._lock = threading.Lock()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 - gRPC method name
                n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                with sink._lock:
                    sink.spans += n
                    if keep:
                        sink.kept.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request, context):  # noqa: N802
                with sink._lock:
                    sink.metric_exports += 1
                    if keep:
                        sink.kept_metrics.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> OtlpSink:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=1).wait()


if __name__ == "__main__":
    s = OtlpSink(int(sys.argv[1]) if len(sys.argv) > 1 else 0).start()
    print(s.port, flush=True)
    s.server.wait_for_termination()
