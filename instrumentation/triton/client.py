"""Trace-context propagation from the real ``tritonclient`` (HTTP and gRPC, sync and asyncio).

Each ``infer`` / ``async_infer`` call gets a CLIENT span, and the W3C ``traceparent`` (``tracestate``) of
that span is written into the HTTP headers / gRPC metadata tritonclient sends, so Triton's own
OpenTelemetry spans (``--trace-config mode=opentelemetry``, Triton 24.01+) become its children. The
caller's ``headers`` dict is copied, never modified. ``start_stream`` (gRPC streaming) gets the caller's
current context in its metadata, without a span of its own.

Patching is done with ``wrapt`` on the client classes (the way opentelemetry-python-contrib's
instrumentations do it) and undone by :func:`unpatch`. Telemetry failures never reach the caller:
if building the span or the headers fails, the call goes out untouched.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, unwrap
from opentelemetry.trace import SpanKind, Status, StatusCode

from infersight.schemas import attributes as A
from infersight.schemas import triton as T

_log = logging.getLogger(__name__)
SCOPE_NAME = __package__  # infersight.instrumentation.triton
_ADDRESS = "_infersight_server_address"
_PROPAGATION_KEYS = ("traceparent", "tracestate")

RequestHook = Callable[[Any, str, dict], None]
"""``request_hook(span, model_name, headers)``: called before the request is sent (headers are the copy sent)."""
ResponseHook = Callable[[Any, Any], None]
"""``response_hook(span, result_or_exception)``: called when the call completes."""

# (module, class, protocol, is_asyncio)
TARGETS = (
    ("tritonclient.http", "InferenceServerClient", "http", False),
    ("tritonclient.grpc", "InferenceServerClient", "grpc", False),
    ("tritonclient.http.aio", "InferenceServerClient", "http", True),
    ("tritonclient.grpc.aio", "InferenceServerClient", "grpc", True),
)


@dataclass
class _Config:
    tracer: Any
    request_hook: RequestHook | None = None
    response_hook: ResponseHook | None = None


_config: _Config | None = None
_patched: list[tuple[Any, str]] = []


def _split_address(url: Any) -> tuple[str, int] | None:
    if not isinstance(url, str) or not url:
        return None
    hostport = url.split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host:
        return hostport, 0
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return hostport, 0


def trace_headers(headers: Any = None, context: Any = None) -> dict:
    """A copy of ``headers`` with the W3C trace context of ``context`` (default: current) written in.

    Any ``traceparent``/``tracestate`` already there (any letter case) is replaced."""
    out = {k: v for k, v in headers.items() if str(k).lower() not in _PROPAGATION_KEYS} \
        if isinstance(headers, dict) else {}
    propagate.inject(out, context=context)
    return out


# Keyed by the plain function, never the bound method the wrapper is given: a bound method as key would keep
# every client instance (and its gRPC channel) alive for the life of the process.
_SIGNATURES: dict[Any, inspect.Signature] = {}


def _bind(wrapped: Any, args: tuple, kwargs: dict) -> inspect.BoundArguments:
    key = getattr(wrapped, "__func__", wrapped)
    sig = _SIGNATURES.get(key)
    if sig is None:
        sig = _SIGNATURES[key] = inspect.signature(wrapped)  # a bound method's: without self
    return sig.bind(*args, **kwargs)


def _start_span(instance: Any, protocol: str, bound: inspect.BoundArguments) -> tuple[Any, dict] | None:
    """The client span and the headers to send, or None to leave the call alone."""
    config = _config
    if config is None or not is_instrumentation_enabled():
        return None
    try:
        model = bound.arguments.get("model_name")
        model = model if isinstance(model, str) else str(model)
        attrs: dict[str, Any] = {A.GEN_AI_REQUEST_MODEL: model, A.GEN_AI_PROVIDER_NAME: "triton",
                                 T.TRITON_PROTOCOL: protocol}
        version = bound.arguments.get("model_version")
        if isinstance(version, str) and version:
            attrs[T.TRITON_MODEL_VERSION_ATTR] = version
        address = getattr(instance, _ADDRESS, None)
        if address:
            attrs[T.SERVER_ADDRESS] = address[0]
            if address[1]:
                attrs[T.SERVER_PORT] = address[1]
        if protocol == "grpc":
            name = f"{T.KSERVE_SERVICE}/ModelInfer"
            attrs.update({T.RPC_SYSTEM: "grpc", T.RPC_SERVICE: T.KSERVE_SERVICE, T.RPC_METHOD: "ModelInfer"})
        else:
            name = "POST /v2/models/{model_name}/infer"
            path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
            attrs.update({T.HTTP_REQUEST_METHOD: "POST", T.URL_PATH: path})
        span = config.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attrs)
        headers = trace_headers(bound.arguments.get("headers"), trace.set_span_in_context(span))
        bound.arguments["headers"] = headers
        if config.request_hook is not None:
            try:
                config.request_hook(span, model, headers)
            except Exception:  # noqa: BLE001 - a user hook must not fail the call
                _log.exception("infersight: the Triton request_hook raised; ignored")
        return span, headers
    except Exception:  # noqa: BLE001 - telemetry must never fail the call
        _log.debug("infersight: could not start the Triton client span", exc_info=True)
        return None


def _end_span(span: Any, result: Any = None, error: BaseException | None = None) -> None:
    try:
        if error is not None:
            span.set_attribute(A.ERROR_TYPE, type(error).__qualname__)
            status = getattr(error, "status", None)
            code = status() if callable(status) else None
            if isinstance(code, str) and code:
                if code.isdigit():
                    span.set_attribute(T.HTTP_RESPONSE_STATUS_CODE, int(code))
                elif code.startswith("StatusCode."):
                    span.set_attribute(T.RPC_GRPC_STATUS_CODE, code.removeprefix("StatusCode."))
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        config = _config
        if config is not None and config.response_hook is not None:
            try:
                config.response_hook(span, error if error is not None else result)
            except Exception:  # noqa: BLE001
                _log.exception("infersight: the Triton response_hook raised; ignored")
    finally:
        span.end()


def _begin(wrapped, instance, protocol: str, args, kwargs):
    """(bound arguments, client span) for a call to trace, or None to pass it to tritonclient untouched
    (a call tritonclient will reject itself, or one _start_span declines)."""
    try:
        bound = _bind(wrapped, args, kwargs)
    except TypeError:
        return None
    started = _start_span(instance, protocol, bound)
    return None if started is None else (bound, started[0])


def _sync_infer(protocol: str):
    def wrapper(wrapped, instance, args, kwargs):
        begun = _begin(wrapped, instance, protocol, args, kwargs)
        if begun is None:
            return wrapped(*args, **kwargs)
        bound, span = begun
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                result = wrapped(*bound.args, **bound.kwargs)
        except BaseException as exc:
            _end_span(span, error=exc)
            raise
        _end_span(span, result)
        return result

    return wrapper


def _async_infer(protocol: str):
    def wrapper(wrapped, instance, args, kwargs):
        begun = _begin(wrapped, instance, protocol, args, kwargs)
        if begun is None:
            return wrapped(*args, **kwargs)
        bound, span = begun
        if protocol == "grpc":  # completion arrives in the user's callback(result=, error=)
            user_callback = bound.arguments.get("callback")

            def callback(result=None, error=None):
                _end_span(span, result, error)
                if user_callback is not None:
                    user_callback(result=result, error=error)

            bound.arguments["callback"] = callback
        try:
            handle = wrapped(*bound.args, **bound.kwargs)
        except BaseException as exc:
            _end_span(span, error=exc)
            raise
        if protocol == "http":  # an InferAsyncRequest around a gevent greenlet
            greenlet = getattr(handle, "_greenlet", None)
            if greenlet is None:
                _end_span(span, handle)
            else:
                _end_http_async(span, handle, greenlet)
        return handle

    return wrapper


def _end_http_async(span: Any, handle: Any, greenlet: Any) -> None:
    """End the span when the greenlet finishes or when get_result() returns, whichever comes first."""
    ended = threading.Lock()

    def end(g: Any) -> None:
        if ended.acquire(blocking=False):
            _end_http_greenlet(span, g)

    greenlet.rawlink(end)
    get_result = handle.get_result

    def get_result_then_end(*args: Any, **kwargs: Any) -> Any:
        try:
            return get_result(*args, **kwargs)
        finally:
            if greenlet.ready():
                end(greenlet)

    handle.get_result = get_result_then_end


def _end_http_greenlet(span: Any, greenlet: Any) -> None:
    error = greenlet.exception
    if error is None:
        status = getattr(greenlet.value, "status_code", 200)
        if isinstance(status, int) and status >= 400:
            from tritonclient.utils import InferenceServerException

            error = InferenceServerException(f"HTTP {status}", status=str(status))
    _end_span(span, greenlet.value, error)


def _aio_infer(protocol: str):
    def wrapper(wrapped, instance, args, kwargs):
        begun = _begin(wrapped, instance, protocol, args, kwargs)
        if begun is None:
            return wrapped(*args, **kwargs)
        bound, span = begun

        async def run():
            try:
                with trace.use_span(span, end_on_exit=False, record_exception=False,
                                    set_status_on_exception=False):
                    result = await wrapped(*bound.args, **bound.kwargs)
            except BaseException as exc:
                _end_span(span, error=exc)
                raise
            _end_span(span, result)
            return result

        return run()

    return wrapper


def _start_stream(wrapped, instance, args, kwargs):
    if _config is None or not is_instrumentation_enabled():
        return wrapped(*args, **kwargs)
    try:
        bound = _bind(wrapped, args, kwargs)
        bound.arguments["headers"] = trace_headers(bound.arguments.get("headers"))
    except Exception:  # noqa: BLE001
        return wrapped(*args, **kwargs)
    return wrapped(*bound.args, **bound.kwargs)


def _remember_address(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    try:
        url = args[0] if args else kwargs.get("url")
        object.__setattr__(instance, _ADDRESS, _split_address(url))
    except Exception:  # noqa: BLE001
        pass
    return result


def patch(tracer: Any, request_hook: RequestHook | None = None, response_hook: ResponseHook | None = None,
          modules: tuple[tuple[str, str, str, bool], ...] = TARGETS) -> list[str]:
    """Wrap the infer methods of every importable tritonclient client class; returns what was patched."""
    from wrapt import wrap_function_wrapper

    global _config
    _config = _Config(tracer, request_hook, response_hook)
    done = []
    for module_name, class_name, protocol, is_aio in modules:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except Exception as exc:  # noqa: BLE001 - e.g. the http extra (gevent) or aiohttp missing
            _log.debug("infersight: %s.%s not instrumented: %r", module_name, class_name, exc)
            continue
        methods: list[tuple[str, Any]] = [("__init__", _remember_address)]
        if is_aio:
            methods.append(("infer", _aio_infer(protocol)))
        else:
            methods += [("infer", _sync_infer(protocol)), ("async_infer", _async_infer(protocol))]
        if protocol == "grpc" and not is_aio:
            methods.append(("start_stream", _start_stream))
        for method, wrapper in methods:
            if method in cls.__dict__ and not hasattr(cls.__dict__[method], "__wrapped__"):
                wrap_function_wrapper(cls, method, wrapper)
                _patched.append((cls, method))
        done.append(f"{module_name}.{class_name}")
    return done


def unpatch() -> None:
    """Restore every method :func:`patch` wrapped (clients created before keep their remembered address)."""
    global _config
    while _patched:
        cls, method = _patched.pop()
        unwrap(cls, method)
    _config = None
