"""Zero-code activation for torch.compile: ``opentelemetry-instrument python serve.py``.

Registered under ``opentelemetry_instrumentor`` as ``infersight_torch_compile``. It does not import torch:
the compile hook is installed when the application imports ``torch._dynamo`` (``torch.compile`` does), or
at once if it already has. Configured by the standard ``OTEL_*`` variables;
``OTEL_PYTHON_INFERSIGHT_TORCH_COMPILE_ENABLED=false`` switches it off alone. By hand::

    TorchCompileInstrumentor().instrument(tracer_provider=tp, meter_provider=mp, compile_hook=print)

Per-call latency needs one line, since only the application knows which module serves requests:
``model = instrument_module(torch.compile(model), "decoder")``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from infersight.instrumentation.activation import may_instrument
from infersight.instrumentation.torch_compile import watcher as W
from infersight.instrumentation.torch_compile.package import _instruments

_log = logging.getLogger(__name__)
ENV_ENABLED = "OTEL_PYTHON_INFERSIGHT_TORCH_COMPILE_ENABLED"
_DYNAMO = "torch._dynamo"


class TorchCompileInstrumentor(BaseInstrumentor):
    """Compile/recompile spans and metrics with reasons and graph breaks, from torch's own hooks."""

    _pending: W.CompileWatcher | None = None
    _hook_registered = False

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: Any) -> None:
        if not may_instrument(ENV_ENABLED, _instruments, "torch.compile"):
            return
        watcher = W.CompileWatcher(kwargs.get("tracer_provider"), kwargs.get("meter_provider"),
                                   kwargs.get("compile_hook"))
        if _DYNAMO in sys.modules:
            W.install(watcher)
            return
        type(self)._pending = watcher
        if not type(self)._hook_registered:  # wrapt cannot unregister: the hook checks _pending
            from wrapt import register_post_import_hook

            register_post_import_hook(self._on_dynamo_import, _DYNAMO)
            type(self)._hook_registered = True

    @classmethod
    def _on_dynamo_import(cls, _module: Any) -> None:
        watcher, cls._pending = cls._pending, None
        if watcher is not None:
            try:
                W.install(watcher)
            except Exception:  # noqa: BLE001 - never break the application's import
                _log.warning("infersight: could not hook torch.compile", exc_info=True)

    def _uninstrument(self, **kwargs: Any) -> None:
        type(self)._pending = None
        W.uninstall()
