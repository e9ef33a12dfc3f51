"""A helper for Triton Python-backend models: ``execute`` spans and metrics, continuing the request's trace.

    import triton_python_backend_utils as pb_utils
    from infersight.instrumentation.triton import traced_execute

    class TritonPythonModel:
        def initialize(self, args):
            self.model_name = args["model_name"]

        @traced_execute()
        def execute(self, requests):
            ...

Per request in the batch, one INTERNAL span ``execute {model}`` (``infersight.stage=execute``) covering the
call, parented to that request's trace. Per call, the execute duration and batch size histograms
(every call, whatever the sampler decides). With a batch of one the request's span is the current span
while ``execute`` runs, so spans the model opens (e.g. the generic API's stages) nest under it.

Where the parent comes from, in order (what Triton provides is an assumption, read from its docs and
tests, not run here): ``request.trace().get_context(mode="opentelemetry")`` (a JSON carrier such as
``{"traceparent": "00-..."}``; python_backend r24.01+, with Triton started in OpenTelemetry trace mode,
so the parent is Triton's own span for the request); else a ``traceparent`` in the request's custom
parameters (``request.parameters()``, a JSON object; the client sets it with ``parameters=``); else the
current context. Nothing here imports ``triton_python_backend_utils``.

The model's exceptions propagate unchanged; the helper's own failures are logged and ignored.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from infersight.instrumentation.config import Settings
from infersight.instrumentation.meters import histogram
from infersight.schemas import attributes as A
from infersight.schemas import triton as T
from infersight.schemas.attributes import SCOPE_VERSION

_log = logging.getLogger(__name__)
SCOPE_NAME = __name__  # infersight.instrumentation.triton.python_backend


def request_parent_context(request: Any) -> context_api.Context | None:
    """The OpenTelemetry context a Triton request carries, or None (see the module doc for the sources)."""
    for carrier in (_trace_carrier(request), _parameter_carrier(request)):
        if carrier:
            ctx = propagate.extract(carrier)
            if trace.get_current_span(ctx).get_span_context().is_valid:
                return ctx
    return None


def _trace_carrier(request: Any) -> dict | None:
    try:
        tracer = request.trace()
        try:
            raw = tracer.get_context(mode="opentelemetry")
        except TypeError:  # python_backend versions whose get_context() takes no mode
            raw = tracer.get_context()
    except Exception:  # noqa: BLE001 - no trace API, or tracing off in Triton
        return None
    return _json_dict(raw)


def _parameter_carrier(request: Any) -> dict | None:
    try:
        params = _json_dict(request.parameters())
    except Exception:  # noqa: BLE001
        return None
    if not params:
        return None
    return {k: str(params[k]) for k in ("traceparent", "tracestate") if isinstance(params.get(k), str)}


def _json_dict(raw: Any) -> dict | None:
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, bytes | str) and raw:
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
    return None


class _ExecuteTelemetry:
    def __init__(self, model_name: str | None, tracer_provider: Any, meter_provider: Any,
                 settings: Settings | None) -> None:
        self.model_name = model_name
        self.settings = settings or Settings.from_env()
        self._tracer_provider, self._meter_provider = tracer_provider, meter_provider
        self._tracer: Any = None
        self._duration: Any = None
        self._batch: Any = None

    def instruments(self) -> tuple[Any, Any, Any]:
        if self._tracer is None:
            tp = self._tracer_provider or trace.get_tracer_provider()
            self._tracer = tp.get_tracer(SCOPE_NAME, SCOPE_VERSION)
            meter = (self._meter_provider or metrics.get_meter_provider()).get_meter(SCOPE_NAME, SCOPE_VERSION)
            self._duration = histogram(meter, T.TRITON_EXECUTE_DURATION, "s",
                                       "Duration of one Python-backend execute() call", T.EXECUTE_BUCKETS)
            self._batch = histogram(meter, T.TRITON_EXECUTE_BATCH, "{request}",
                                    "Requests per Python-backend execute() call", T.BATCH_BUCKETS)
        return self._tracer, self._duration, self._batch

    def model_for(self, model_self: Any) -> str:
        name = self.model_name or getattr(model_self, "model_name", None)
        return name if isinstance(name, str) and name else "unknown"

    def base_attributes(self, model: str) -> dict[str, Any]:
        attrs = {A.GEN_AI_REQUEST_MODEL: model, A.ENGINE: "triton", A.STAGE: T.TRITON_EXECUTE_STAGE,
                 A.DEPLOYMENT_TRACK: self.settings.track}
        if self.settings.model_version:
            attrs[A.MODEL_VERSION] = self.settings.model_version
        return attrs


def traced_execute(model_name: str | None = None, *, tracer_provider: Any = None, meter_provider: Any = None,
                   settings: Settings | None = None) -> Callable[[Callable], Callable]:
    """Decorate ``TritonPythonModel.execute(self, requests)``; ``model_name`` defaults to ``self.model_name``."""
    telemetry = _ExecuteTelemetry(model_name, tracer_provider, meter_provider, settings)

    def decorate(execute: Callable) -> Callable:
        @functools.wraps(execute)
        def wrapper(model_self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
            started = _begin(telemetry, model_self, requests)
            if started is None:
                return execute(model_self, requests, *args, **kwargs)
            spans, token, t0, model = started
            error: BaseException | None = None
            responses: Any = None
            try:
                responses = execute(model_self, requests, *args, **kwargs)
                return responses
            except BaseException as exc:
                error = exc
                raise
            finally:
                _finish(telemetry, spans, token, t0, model, responses, error)

        return wrapper

    return decorate


def _begin(telemetry: _ExecuteTelemetry, model_self: Any, requests: Any) -> tuple | None:
    try:
        tracer, _d, _b = telemetry.instruments()
        model = telemetry.model_for(model_self)
        batch = list(requests) if isinstance(requests, list | tuple) else []
        attrs = {**telemetry.base_attributes(model), T.TRITON_BATCH_SIZE: len(batch)}
        spans = []
        for request in batch:
            span_attrs = dict(attrs)
            request_id = _call(request, "request_id")
            if isinstance(request_id, str) and request_id:
                span_attrs[T.TRITON_REQUEST_ID] = request_id
            spans.append(tracer.start_span(f"execute {model}", context=request_parent_context(request),
                                           kind=SpanKind.INTERNAL, attributes=span_attrs))
        token = context_api.attach(trace.set_span_in_context(spans[0])) if len(spans) == 1 else None
        return spans, token, time.perf_counter(), model
    except Exception:  # noqa: BLE001 - never fail the model
        _log.warning("infersight: could not start execute() telemetry; the model runs uninstrumented",
                     exc_info=True)
        return None


def _call(obj: Any, method: str) -> Any:
    try:
        return getattr(obj, method)()
    except Exception:  # noqa: BLE001
        return None


def _finish(telemetry: _ExecuteTelemetry, spans: list, token: Any, t0: float, model: str, responses: Any,
            error: BaseException | None) -> None:
    try:
        if token is not None:
            context_api.detach(token)
        duration = time.perf_counter() - t0
        _t, duration_hist, batch_hist = telemetry.instruments()
        metric_attrs = {A.GEN_AI_REQUEST_MODEL: model, A.DEPLOYMENT_TRACK: telemetry.settings.track}
        if error is not None:
            metric_attrs[A.ERROR_TYPE] = type(error).__qualname__
        duration_hist.record(duration, metric_attrs)
        batch_hist.record(len(spans), {A.GEN_AI_REQUEST_MODEL: model})
        per_request = list(responses) if isinstance(responses, list | tuple) else []
        for i, span in enumerate(spans):
            if error is not None:
                span.set_attribute(A.ERROR_TYPE, type(error).__qualname__)
                span.record_exception(error)
                span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
            elif i < len(per_request) and _call(per_request[i], "has_error") is True:
                span.set_attribute(A.ERROR_TYPE, "TritonError")
                span.set_status(Status(StatusCode.ERROR, "the response carries a TritonError"))
            span.end()
    except Exception:  # noqa: BLE001
        _log.warning("infersight: could not finish execute() telemetry", exc_info=True)
