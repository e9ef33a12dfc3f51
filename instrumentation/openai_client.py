"""The client's view: instrumentation for callers of the OpenAI Python client (``openai`` 1.x), chat and text
completions, streamed or not.

Per call, a CLIENT span ``{operation} {model}`` following the OpenTelemetry GenAI client conventions
(``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.response.id``, ``gen_ai.response.finish_reasons``, ``gen_ai.usage.*``, ``server.address``/``port``,
``error.type``), the metrics ``gen_ai.client.operation.duration`` and ``gen_ai.client.token.usage``, and the
client's time to first token: ``infersight.client.ttft`` on the span and the
``infersight.client.time_to_first_token`` histogram — from the call to the first chunk that carries text,
reasoning or a tool call (streamed), or to the parsed response (not streamed). The call's W3C
``traceparent`` goes out in its headers, so the server's spans join the client's trace.

Why not ``opentelemetry-instrumentation-openai-v2`` (2.4b0, with ``opentelemetry-util-genai`` 1.3b0): it
records time to first *chunk* (``gen_ai.client.operation.time_to_first_chunk``), and vLLM's first chunk of a
chat stream is the assistant role with no token, so it is not the TTFT users feel (and it keeps no ``n``
token count per chunk). This module records the first token; it keeps the conventions' names otherwise.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import metrics, propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from infersight.instrumentation.meters import histogram
from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas.attributes import SCOPE_NAME, SCOPE_VERSION
from infersight.schemas.registry import get

NS = 1_000_000_000
_MARK = "__infersight_openai__"
_TOKEN_DELTA_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


def _carries_token(chunk: Any) -> bool:
    for choice in getattr(chunk, "choices", None) or ():
        if getattr(choice, "text", None):  # completions
            return True
        delta = getattr(choice, "delta", None)
        if delta is not None and any(getattr(delta, f, None) for f in _TOKEN_DELTA_FIELDS):
            return True
    return False


class _Call:
    """One client call's span and measurements."""

    def __init__(self, inst: OpenAIClientInstrumentor, operation: str, model: str, base_url: Any) -> None:
        self.inst, self.operation, self.model = inst, operation, model
        attrs: dict[str, Any] = {A.GEN_AI_OPERATION_NAME: operation, A.GEN_AI_PROVIDER_NAME: "openai",
                                 A.GEN_AI_REQUEST_MODEL: model}
        url = urlsplit(str(base_url)) if base_url is not None else None
        if url is not None and url.hostname:
            attrs[SERVER_ADDRESS] = url.hostname
            if url.port:
                attrs[SERVER_PORT] = url.port
        self.metric_attrs = {k: attrs[k] for k in (A.GEN_AI_OPERATION_NAME, A.GEN_AI_PROVIDER_NAME,
                                                   A.GEN_AI_REQUEST_MODEL)}
        self.span = inst.tracer.start_span(f"{operation} {model}", kind=SpanKind.CLIENT, attributes=attrs)
        self.t0 = time.perf_counter_ns()
        self.ttft_s: float | None = None
        self.usage: Any = None
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.finish_reasons: list[str] = []
        self.done = False

    def headers(self, given: Any) -> dict[str, str]:
        headers = dict(given or {})
        propagate.inject(headers, context=trace.set_span_in_context(self.span))
        return headers

    def first_token(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = (time.perf_counter_ns() - self.t0) / NS

    def see(self, chunk: Any) -> None:
        """A stream chunk as it arrives: the first one carrying a token stops the TTFT clock."""
        if self.ttft_s is None and _carries_token(chunk):
            self.first_token()
        self.absorb(chunk)

    def absorb(self, obj: Any) -> None:
        """A response or a stream chunk: ids, model, finish reasons, usage."""
        self.response_id = getattr(obj, "id", None) or self.response_id
        self.response_model = getattr(obj, "model", None) or self.response_model
        for choice in getattr(obj, "choices", None) or ():
            reason = getattr(choice, "finish_reason", None)
            if reason:
                self.finish_reasons.append(str(reason))
        self.usage = getattr(obj, "usage", None) or self.usage

    def end(self, error: BaseException | None = None) -> None:
        if self.done:
            return
        self.done = True
        duration_s = (time.perf_counter_ns() - self.t0) / NS
        span, attrs, inst = self.span, dict(self.metric_attrs), self.inst
        if self.response_model:
            span.set_attribute(A.GEN_AI_RESPONSE_MODEL, self.response_model)
            attrs[A.GEN_AI_RESPONSE_MODEL] = self.response_model
        if self.response_id:
            span.set_attribute(A.GEN_AI_RESPONSE_ID, self.response_id)
        if self.finish_reasons:
            span.set_attribute(A.GEN_AI_RESPONSE_FINISH_REASONS, self.finish_reasons)
        if error is not None:
            attrs[A.ERROR_TYPE] = type(error).__qualname__
            span.set_attribute(A.ERROR_TYPE, attrs[A.ERROR_TYPE])
            span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
        usage = self.usage
        for kind, field, key in (("input", "prompt_tokens", A.GEN_AI_USAGE_INPUT_TOKENS),
                                 ("output", "completion_tokens", A.GEN_AI_USAGE_OUTPUT_TOKENS)):
            count = getattr(usage, field, None) if usage is not None else None
            if isinstance(count, int):
                span.set_attribute(key, count)
                inst.token_usage.record(count, {**attrs, A.GEN_AI_TOKEN_TYPE: kind})
        if self.ttft_s is not None and error is None:
            span.set_attribute(CLIENT_TTFT, self.ttft_s)
            inst.ttft.record(self.ttft_s, attrs)
        inst.duration.record(duration_s, attrs)
        span.end()


class _TimedStream:
    """The client's ``Stream``/``AsyncStream``, timing its first token and ending the span with it."""

    def __init__(self, stream: Any, call: _Call) -> None:
        self._stream, self._call = stream, call

    def __iter__(self) -> Iterator[Any]:
        call = self._call
        try:
            for chunk in self._stream:
                call.see(chunk)
                yield chunk
        except BaseException as exc:
            call.end(exc)
            raise
        call.end()

    async def __aiter__(self):
        call = self._call
        try:
            async for chunk in self._stream:
                call.see(chunk)
                yield chunk
        except BaseException as exc:
            call.end(exc)
            raise
        call.end()

    def __enter__(self) -> _TimedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> _TimedStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stream.close()
        self._call.end()

    def close(self) -> None:
        self._stream.close()
        self._call.end()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


CLIENT_TTFT = A.CLIENT_TTFT
SERVER_ADDRESS, SERVER_PORT = A.SERVER_ADDRESS, A.SERVER_PORT


class OpenAIClientInstrumentor:
    """``OpenAIClientInstrumentor().instrument()`` patches the ``openai`` package's chat and text completion
    resources (sync and async) once; ``uninstrument()`` restores them."""

    _TARGETS = (("openai.resources.chat.completions", "Completions", "chat", False),
                ("openai.resources.chat.completions", "AsyncCompletions", "chat", True),
                ("openai.resources.completions", "Completions", "text_completion", False),
                ("openai.resources.completions", "AsyncCompletions", "text_completion", True))

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self.tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(SCOPE_NAME, SCOPE_VERSION)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(SCOPE_NAME, SCOPE_VERSION)
        self.duration = _hist(meter, M.GEN_AI_CLIENT_OPERATION_DURATION)
        self.token_usage = _hist(meter, M.GEN_AI_CLIENT_TOKEN_USAGE)
        self.ttft = _hist(meter, M.CLIENT_TTFT_METRIC)
        self._patched: list[tuple[Any, Any]] = []

    def instrument(self) -> OpenAIClientInstrumentor:
        import importlib

        for module_name, class_name, operation, is_async in self._TARGETS:
            cls = getattr(importlib.import_module(module_name), class_name)
            original = cls.create
            if getattr(original, _MARK, False):
                continue
            wrapper = self._async_wrapper(original, operation) if is_async else self._wrapper(original, operation)
            setattr(wrapper, _MARK, True)
            cls.create = wrapper
            self._patched.append((cls, original))
        return self

    def uninstrument(self) -> None:
        for cls, original in reversed(self._patched):
            cls.create = original
        self._patched.clear()

    def _start(self, resource: Any, operation: str, kwargs: dict) -> _Call:
        client = getattr(resource, "_client", None)
        call = _Call(self, operation, str(kwargs.get("model", "unknown")), getattr(client, "base_url", None))
        kwargs["extra_headers"] = call.headers(kwargs.get("extra_headers"))
        return call

    def _wrapper(self, original: Any, operation: str) -> Any:
        @functools.wraps(original)
        def create(resource: Any, *args: Any, **kwargs: Any) -> Any:
            call = self._start(resource, operation, kwargs)
            try:
                result = original(resource, *args, **kwargs)
            except BaseException as exc:
                call.end(exc)
                raise
            if kwargs.get("stream"):
                return _TimedStream(result, call)
            call.first_token()  # the whole response: its bytes hold the first token
            call.absorb(result)
            call.end()
            return result

        return create

    def _async_wrapper(self, original: Any, operation: str) -> Any:
        @functools.wraps(original)
        async def create(resource: Any, *args: Any, **kwargs: Any) -> Any:
            call = self._start(resource, operation, kwargs)
            try:
                result = await original(resource, *args, **kwargs)
            except BaseException as exc:
                call.end(exc)
                raise
            if kwargs.get("stream"):
                return _TimedStream(result, call)
            call.first_token()
            call.absorb(result)
            call.end()
            return result

        return create


def _hist(meter: Any, name: str) -> Any:
    entry = get(name)
    return histogram(meter, name, entry.unit, entry.description, entry.buckets)
