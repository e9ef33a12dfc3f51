"""Which OpenTelemetry providers the vLLM plugin uses, from the standard ``OTEL_*`` variables.

Order: providers passed explicitly; else the global ones when an SDK provider is installed there (by
``opentelemetry-instrument``, by the application, or by vLLM's own tracing); else, when an OTLP endpoint
is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or the per-signal ``..._TRACES_/..._METRICS_ENDPOINT``),
private SDK providers exporting over OTLP (``OTEL_EXPORTER_OTLP_PROTOCOL`` grpc or http/protobuf), with
the resource from ``OTEL_RESOURCE_ATTRIBUTES``/``OTEL_SERVICE_NAME`` plus ``INFERSIGHT_*``; else the
global no-op providers. Private providers are not made global (vLLM's tracing may want that slot) and
are flushed at exit. ``OTEL_TRACES_EXPORTER``/``OTEL_METRICS_EXPORTER=none`` turn a signal off.
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import metrics, trace

from infersight.instrumentation.config import Settings, build_resource
from infersight.schemas import attributes as A

_log = logging.getLogger(__name__)


@dataclass
class Providers:
    tracer_provider: Any
    meter_provider: Any
    owned: list = field(default_factory=list)

    def shutdown(self) -> None:
        for provider in self.owned:
            try:
                provider.shutdown()
            except Exception:  # noqa: BLE001
                pass
        self.owned.clear()

    def force_flush(self) -> None:
        for provider in self.owned:
            try:
                provider.force_flush()
            except Exception:  # noqa: BLE001
                pass


def _is_sdk_tracer_provider(provider: Any) -> bool:
    return hasattr(provider, "add_span_processor") and hasattr(provider, "_active_span_processor")


def _is_sdk_meter_provider(provider: Any) -> bool:
    return hasattr(provider, "_measurement_consumer")


def _endpoint(env: Mapping[str, str], signal: str) -> str | None:
    return env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None


def _enabled(env: Mapping[str, str], signal: str) -> bool:
    return env.get(f"OTEL_{signal}_EXPORTER", "otlp").strip().lower() != "none"


def _protocol(env: Mapping[str, str], signal: str) -> str:
    return (env.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc").strip().lower()


def _span_exporter(env: Mapping[str, str]):
    if _protocol(env, "TRACES") == "grpc":
        from infersight.instrumentation.otlp import OTLPSpanExporter  # the SDK's, with a 3x faster encoder
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()  # endpoint, headers, TLS, timeout: from the OTEL_* variables


def _metric_exporter(env: Mapping[str, str]):
    if _protocol(env, "METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def _resource(settings: Settings | None, model: str | None):  # -> opentelemetry.sdk.resources.Resource
    """Our resource; with the served model on it, since a vLLM engine serves one model: the pipeline rolls the
    engine's gauges and cost up per model from it."""
    resource = build_resource(settings)
    if model:
        from opentelemetry.sdk.resources import Resource

        resource = resource.merge(Resource({A.GEN_AI_REQUEST_MODEL: model}))
    return resource


def resolve(tracer_provider: Any = None, meter_provider: Any = None, settings: Settings | None = None,
            environ: Mapping[str, str] | None = None, model: str | None = None) -> Providers:
    """The providers to report with: the caller's, else the SDK's global ones, else our own from the ``OTEL_*``
    environment (``model``: the served model, put on our own providers' resource)."""
    env = os.environ if environ is None else environ
    out = Providers(tracer_provider, meter_provider)
    resource = None
    if out.tracer_provider is None:
        global_tp = trace.get_tracer_provider()
        if _is_sdk_tracer_provider(global_tp):
            out.tracer_provider = global_tp
        elif _enabled(env, "TRACES") and _endpoint(env, "TRACES"):
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            resource = _resource(settings, model)
            out.tracer_provider = TracerProvider(resource=resource)  # sampler: OTEL_TRACES_SAMPLER
            out.tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(env)))
            out.owned.append(out.tracer_provider)
        else:
            out.tracer_provider = global_tp
    if out.meter_provider is None:
        global_mp = metrics.get_meter_provider()
        if _is_sdk_meter_provider(global_mp):
            out.meter_provider = global_mp
        elif _enabled(env, "METRICS") and _endpoint(env, "METRICS"):
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            from infersight.instrumentation.meters import views

            reader = PeriodicExportingMetricReader(_metric_exporter(env))  # OTEL_METRIC_EXPORT_INTERVAL
            out.meter_provider = MeterProvider(metric_readers=[reader], resource=resource or _resource(settings, model),
                                               views=views())
            out.owned.append(out.meter_provider)
        else:
            out.meter_provider = global_mp
    if out.owned:
        atexit.register(out.shutdown)
    if not (_is_sdk_tracer_provider(out.tracer_provider) or _is_sdk_meter_provider(out.meter_provider)):
        _log.info("infersight: no OpenTelemetry SDK provider and no OTEL_EXPORTER_OTLP_ENDPOINT; the vLLM "
                  "plugin records into the no-op providers (set OTEL_EXPORTER_OTLP_ENDPOINT to export)")
    return out
