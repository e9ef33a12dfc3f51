"""The Python-backend helper, with request objects shaped like python_backend's ``pb_utils.InferenceRequest``
(``trace().get_context(mode=...)``, ``parameters()``, ``request_id()``): Triton itself cannot run here."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from infersight.instrumentation.config import Settings
from infersight.instrumentation.triton import request_parent_context, traced_execute
from infersight.schemas import attributes as A
from infersight.schemas import triton as T

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{SPAN_ID}-01"


class FakeTrace:
    def __init__(self, context):
        self._context = context

    def get_context(self, mode="triton"):
        return self._context if mode == "opentelemetry" else None


class FakeRequest:
    def __init__(self, otel_context=None, parameters="{}", request_id="r1"):
        self._trace, self._parameters, self._id = FakeTrace(otel_context), parameters, request_id

    def trace(self):
        return self._trace

    def parameters(self):
        return self._parameters

    def request_id(self):
        return self._id


class FakeResponse:
    def __init__(self, error=False):
        self._error = error

    def has_error(self):
        return self._error


@pytest.fixture
def otel():
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, MeterProvider(metric_readers=[reader]), exporter, reader


def _model(otel, fail=False, error_response=False):
    tp, mp, _, _ = otel

    class TritonPythonModel:
        model_name = "bls-llm"

        @traced_execute(tracer_provider=tp, meter_provider=mp, settings=Settings(track="canary"))
        def execute(self, requests):
            if fail:
                raise RuntimeError("model broke")
            return [FakeResponse(error_response and i == 1) for i, _ in enumerate(requests)]

    return TritonPythonModel()


def _points(reader, name):
    data = reader.get_metrics_data()
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name
            for p in m.data.data_points]


def test_execute_span_continues_tritons_context(otel):
    _, _, exporter, reader = otel
    requests = [FakeRequest(json.dumps({"traceparent": TRACEPARENT}), request_id="abc")]
    responses = _model(otel).execute(requests)
    assert len(responses) == 1
    (span,) = exporter.get_finished_spans()
    assert span.name == "execute bls-llm"
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{span.parent.span_id:016x}" == SPAN_ID
    assert span.attributes[A.STAGE] == T.TRITON_EXECUTE_STAGE
    assert span.attributes[A.ENGINE] == "triton"
    assert span.attributes[A.DEPLOYMENT_TRACK] == "canary"
    assert span.attributes[T.TRITON_BATCH_SIZE] == 1
    assert span.attributes[T.TRITON_REQUEST_ID] == "abc"
    (duration,) = _points(reader, T.TRITON_EXECUTE_DURATION)
    assert duration.count == 1 and duration.sum > 0
    assert dict(duration.attributes)[A.GEN_AI_REQUEST_MODEL] == "bls-llm"
    (batch,) = _points(reader, T.TRITON_EXECUTE_BATCH)
    assert batch.sum == 1


def test_batch_gets_one_span_per_request_each_in_its_own_trace(otel):
    _, _, exporter, reader = otel
    other = "0af7651916cd43dd8448eb211c80319c"
    requests = [FakeRequest(json.dumps({"traceparent": TRACEPARENT})),
                FakeRequest(parameters=json.dumps({"traceparent": f"00-{other}-b7ad6b7169203331-01"})),
                FakeRequest()]
    _model(otel, error_response=True).execute(requests)
    spans = exporter.get_finished_spans()
    assert [f"{s.context.trace_id:032x}" for s in spans[:2]] == [TRACE_ID, other]
    assert spans[2].parent is None  # no context anywhere: a new trace
    assert spans[1].status.status_code is StatusCode.ERROR  # its response carried a TritonError
    assert spans[0].status.status_code is StatusCode.UNSET
    assert _points(reader, T.TRITON_EXECUTE_BATCH)[0].sum == 3


def test_model_exception_propagates_and_is_recorded(otel):
    _, _, exporter, reader = otel
    with pytest.raises(RuntimeError, match="model broke"):
        _model(otel, fail=True).execute([FakeRequest()])
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[A.ERROR_TYPE] == "RuntimeError"
    assert dict(_points(reader, T.TRITON_EXECUTE_DURATION)[0].attributes)[A.ERROR_TYPE] == "RuntimeError"


@pytest.mark.parametrize("request_obj", [object(), FakeRequest("not json"), FakeRequest("[1]"),
                                         FakeRequest(parameters=b"\xff"),
                                         FakeRequest(parameters="{\"traceparent\": 5}"),
                                         FakeRequest(json.dumps({"traceparent": "garbage"}))])
def test_bad_requests_never_fail_the_model(otel, request_obj):
    _, _, exporter, _ = otel
    assert request_parent_context(request_obj) is None
    assert _model(otel).execute([request_obj])[0].has_error() is False
    assert len(exporter.get_finished_spans()) == 1


def test_non_list_requests_still_run(otel):
    assert _model(otel).execute(iter([])) == []
