"""The vLLM plugin's own providers carry the served model on their resource (a vLLM engine serves one model;
the pipeline rolls its gauges and cost up per model from the resource)."""

from __future__ import annotations

from unittest import mock

from opentelemetry import metrics, trace

from infersight.instrumentation.vllm_adapter import providers
from infersight.schemas import attributes as A

ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}


def _no_global_sdk_providers():
    return mock.patch.multiple(providers, _is_sdk_tracer_provider=lambda p: False,
                               _is_sdk_meter_provider=lambda p: False)


def _resolve(**kwargs):
    """resolve() with no global SDK providers; returns it and the resource each SDK provider was built with."""
    from opentelemetry.sdk.metrics import MeterProvider

    built = {}

    def meter_provider(*args, **kw):
        built["meter"] = kw["resource"]
        return MeterProvider(*args, **kw)

    with _no_global_sdk_providers(), mock.patch("opentelemetry.sdk.metrics.MeterProvider", meter_provider):
        out = providers.resolve(environ=ENV, **kwargs)
    assert len(out.owned) == 2, "no OTLP endpoint seen: the test built nothing"
    built["tracer"] = out.tracer_provider.resource
    return out, built


def test_own_providers_put_the_served_model_on_the_resource():
    out, built = _resolve(model="llama-3.1-8b-instruct")
    try:
        for resource in built.values():
            assert resource.attributes[A.GEN_AI_REQUEST_MODEL] == "llama-3.1-8b-instruct"
    finally:
        out.shutdown()


def test_without_a_model_the_resource_has_none():
    out, built = _resolve()
    try:
        assert all(A.GEN_AI_REQUEST_MODEL not in r.attributes for r in built.values())
    finally:
        out.shutdown()


def test_callers_providers_are_used_as_they_are():
    tp, mp = trace.NoOpTracerProvider(), metrics.NoOpMeterProvider()
    out = providers.resolve(tp, mp, environ=ENV, model="m")
    assert out.tracer_provider is tp and out.meter_provider is mp and not out.owned
