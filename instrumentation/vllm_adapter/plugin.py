"""The vLLM stat-logger plugin: ``InfersightStatLogger``.

vLLM loads it from the ``vllm.stat_logger_plugins`` entry-point group (AsyncLLM and the OpenAI server,
in the frontend process; vLLM requires the entry point to name a ``StatLoggerBase`` subclass), or takes
it as ``AsyncLLM.from_engine_args(..., stat_loggers=[InfersightStatLogger])``. To pass providers:
``stat_loggers=[functools.partial(InfersightStatLogger, tracer_provider=tp, meter_provider=mp)]``.
Set ``VLLM_PLUGINS`` to a list without ``infersight`` to keep the entry point from loading.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase

from infersight.instrumentation import selftelemetry as bad
from infersight.instrumentation.vllm_adapter import edge
from infersight.instrumentation.vllm_adapter import providers as providers_mod
from infersight.instrumentation.vllm_adapter.edge import EDGES
from infersight.instrumentation.vllm_adapter.looplag import LoopLag
from infersight.instrumentation.vllm_adapter.tracecontext import (
    PARENTS,
    attach_llm_request_capture,
    install_header_capture,
)
from infersight.instrumentation.vllm_adapter.translate import StatsTranslator
from infersight.schemas.attributes import SCOPE_NAME, SCOPE_VERSION

_log = logging.getLogger(__name__)
PINNED_VLLM_VERSION = "0.32.0"
ENTRY_POINT_NAME = "infersight"
_version_checked = False
_instances: dict[tuple[int, int], weakref.ref] = {}
_instances_lock = threading.Lock()


def check_vllm_version() -> str:
    """vLLM's version; logs once when it is not the version this adapter was tested against."""
    global _version_checked
    try:
        from vllm import __version__ as version
    except ImportError:
        version = "unknown"
    if not _version_checked:
        _version_checked = True
        if version != PINNED_VLLM_VERSION:
            _log.warning("infersight: the vLLM adapter is tested against vllm %s, found %s; stats fields are "
                         "read defensively, but check the stage spans and metrics", PINNED_VLLM_VERSION, version)
    return version


def _served_model_name(vllm_config: Any) -> str:
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None) or getattr(model_config, "model", None)
    if isinstance(name, list | tuple):
        name = name[0] if name else None
    return str(name) if name else "unknown"


class InfersightStatLogger(StatLoggerBase):
    """Per-engine stat logger: vLLM scheduler/iteration/finished-request stats -> infersight telemetry."""

    def __init__(self, vllm_config: Any, engine_index: int = 0, *, tracer_provider: Any = None,
                 meter_provider: Any = None, gpu: bool = True) -> None:
        self.vllm_version = check_vllm_version()
        self.engine_index = engine_index
        self.translator: StatsTranslator | None = None
        key = (id(vllm_config), engine_index)
        with _instances_lock:  # loaded both as stat_loggers= and via the entry point: only one reports
            other = _instances.get(key)
            if other is not None and other() is not None:
                _log.info("infersight: a second InfersightStatLogger for engine %d is inactive", engine_index)
                return
            _instances[key] = weakref.ref(self)
        observability = getattr(vllm_config, "observability_config", None)
        self.vllm_tracing = getattr(observability, "otlp_traces_endpoint", None) is not None
        model = _served_model_name(vllm_config)
        self.providers = providers_mod.resolve(tracer_provider, meter_provider, model=model)
        meter_provider = self.providers.meter_provider
        # the edge timer: the server's app is built after the engine client (and so after this logger)
        self.edge_timed = edge.install(EDGES)
        edge.install_first_token_latency()
        if EDGES.lag is None:
            EDGES.lag = LoopLag(meter_provider.get_meter(SCOPE_NAME, SCOPE_VERSION))
        self.translator = StatsTranslator(
            model, tracer_provider=self.providers.tracer_provider,
            meter_provider=meter_provider, vllm_tracing=self.vllm_tracing, parents=PARENTS,
            gpu=gpu, edges=EDGES)
        if self.vllm_tracing:
            from opentelemetry import trace

            # vLLM's init_tracer ran before the stat loggers are built; its provider is the global one.
            if not attach_llm_request_capture(trace.get_tracer_provider()):
                _log.warning("infersight: vLLM tracing is on but the global tracer provider is not the SDK's; "
                             "stage spans cannot be parented to llm_request spans")
        install_header_capture(PARENTS, edges=EDGES, capture_headers=not self.vllm_tracing)

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        translator = self.translator
        if translator is None:
            return
        try:
            translator.record(scheduler_stats, iteration_stats)
        except Exception as exc:  # noqa: BLE001 - never break vLLM's output loop
            translator.inst.self_telemetry.bad_input(bad.INTERNAL, f"vLLM stats translation failed: {exc!r}")

    def log_engine_initialized(self) -> None:
        if self.translator is not None:
            _log.info("infersight: vLLM %s engine %d instrumented (vLLM tracing %s)", self.vllm_version,
                      self.engine_index, "on: stage spans under llm_request" if self.vllm_tracing else "off")

    def log(self) -> None:
        pass

    def force_flush(self) -> None:
        if self.translator is not None:
            self.providers.force_flush()
