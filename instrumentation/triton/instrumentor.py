"""Zero-code activation for tritonclient: ``opentelemetry-instrument <your client or server command>``.

Registered under the ``opentelemetry_instrumentor`` entry point as ``infersight_triton``. Configured by the
standard ``OTEL_*`` variables (exporters, sampler, resource, ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS``) and
``OTEL_PYTHON_INFERSIGHT_TRITON_ENABLED=false`` to switch it off alone. Or by hand::

    TritonClientInstrumentor().instrument(tracer_provider=tp, request_hook=..., response_hook=...)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.dependencies import get_dependency_conflicts
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from infersight.instrumentation.spans import SCOPE_VERSION
from infersight.instrumentation.triton import client
from infersight.instrumentation.triton.package import _instruments

_log = logging.getLogger(__name__)
ENV_ENABLED = "OTEL_PYTHON_INFERSIGHT_TRITON_ENABLED"


def _enabled_by_env() -> bool:
    return os.environ.get(ENV_ENABLED, "true").strip().lower() not in ("0", "false", "no", "off")


class TritonClientInstrumentor(BaseInstrumentor):
    """Client spans and W3C trace-context propagation for tritonclient's HTTP and gRPC clients."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        if not _enabled_by_env():
            _log.info("infersight: %s=false, tritonclient not instrumented", ENV_ENABLED)
            return
        # opentelemetry-instrument skips the version check (skip_dep_check); do it here so an
        # unsupported tritonclient is left alone rather than patched blindly.
        conflict = get_dependency_conflicts(list(_instruments))
        if conflict is not None:
            _log.warning("infersight: tritonclient not instrumented: %s", conflict)
            return
        provider = kwargs.get("tracer_provider") or trace.get_tracer_provider()
        tracer = provider.get_tracer(client.SCOPE_NAME, SCOPE_VERSION)
        patched = client.patch(tracer, kwargs.get("request_hook"), kwargs.get("response_hook"))
        _log.debug("infersight: instrumented %s", ", ".join(patched))

    def _uninstrument(self, **kwargs: Any) -> None:
        client.unpatch()
