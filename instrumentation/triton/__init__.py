"""Triton Inference Server adapter: trace-context propagation from tritonclient (HTTP/gRPC) into Triton's
own OpenTelemetry spans, a helper for Python-backend models, and (in ``infersight.schemas.triton``)
Triton's span events and metric names mapped onto ours. See docs/triton.md for what is verified how."""

from infersight.instrumentation.triton.client import trace_headers
from infersight.instrumentation.triton.instrumentor import TritonClientInstrumentor
from infersight.instrumentation.triton.python_backend import request_parent_context, traced_execute

__all__ = ["TritonClientInstrumentor", "request_parent_context", "trace_headers", "traced_execute"]
