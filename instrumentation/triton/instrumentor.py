"""Zero-code activation for tritonclient: ``opentelemetry-instrument <your client or server command>``.

Registered under the ``opentelemetry_instrumentor`` entry point as ``infersight_triton``. Configured by the
standard ``OTEL_*`` variables (exporters, sampler, resource, ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``) and
``OTEL_PYTHON_INFERSIGHT_TRITON_ENABLED=false`` to switch it off alone. Or by hand::

    TritonClientInstrumentor().instrument(tracer_provider=tp, request_hook=..., response_hook=...)
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from infersight.instrumentation.activation import may_instrument
from infersight.instrumentation.triton import client
from infersight.instrumentation.triton.package import _instruments
from infersight.schemas.attributes import SCOPE_VERSION

_log = logging.getLogger(__name__)
ENV_ENABLED = "OTEL_PYTHON_INFERSIGHT_TRITON_ENABLED"


class TritonClientInstrumentor(BaseInstrumentor):
    """Client spans and W3C trace-context propagation for tritonclient's HTTP and gRPC clients."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        if not may_instrument(ENV_ENABLED, _instruments, "tritonclient"):
            return
        provider = kwargs.get("tracer_provider") or trace.get_tracer_provider()
        tracer = provider.get_tracer(client.SCOPE_NAME, SCOPE_VERSION)
        patched = client.patch(tracer, kwargs.get("request_hook"), kwargs.get("response_hook"))
        _log.debug("infersight: instrumented %s", ", ".join(patched))

    def _uninstrument(self, **kwargs: Any) -> None:
        client.unpatch()
