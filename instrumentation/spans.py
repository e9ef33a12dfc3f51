"""Span output. With the OpenTelemetry SDK's ``TracerProvider`` (the usual case) spans are built cheaply:
the provider's own sampler and id generator decide and name them at request start, and at request end
finished ``ReadableSpan`` objects go straight to the provider's span processors (a BatchSpanProcessor's
queue directly), skipping the SDK's live-span machinery (locks, attribute re-validation, per-call context
handling). This leans on a few internals of the SDK and API (the processor list, the context key of the current
span, the runtime context's ContextVar, a BatchSpanProcessor's queue, ReadableSpan's fields); each is
found by feature detection, never by version number, and where one is missing or differs (older SDKs: the
supported range starts at 1.27) the public path takes over for that piece: the API's context functions,
``on_end``, ``ReadableSpan``'s constructor, or, without the context key or the provider's fields, the
plain path. The tests check each against the real packages and force each fallback. Any other provider
gets the plain API path: real spans with explicit start and end times.

For a trace the sampler dropped, only the root span is exported, marked ``infersight.record_only`` (the
request's record: the Flink metrics need every request); with the plain path, nothing.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

from opentelemetry import context as context_api
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace import propagation as _trace_propagation
from opentelemetry.trace.span import DEFAULT_TRACE_STATE
from opentelemetry.trace.status import Status, StatusCode

from infersight.schemas.attributes import RECORD_ONLY, SCOPE_NAME, SCOPE_VERSION

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)  # immutable; one for every span without an error
# SpanContext is a tuple (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid): a copy of a valid
# one is built without its constructor's keyword parsing and id checks
_new_span_context = functools.partial(tuple.__new__, SpanContext)


_TRACE_ID_MAX, _SPAN_ID_MAX = 2**128 - 1, 2**64 - 1
# the context key under which the API keeps the current span (private to the pinned API: without it, the
# plain path is used)
_SPAN_KEY = getattr(_trace_propagation, "_SPAN_KEY", None)


def context_ops() -> tuple[Callable, Callable, Callable]:
    """get_current, attach and detach straight on the ContextVar behind OpenTelemetry's default runtime
    context (the API's functions add one or two Python calls each, several times a request); the API's own
    with any other runtime context. The ContextVar's reset raises where the API's detach logs: callers
    fall back to ``context_api.detach`` on an exception."""
    runtime = getattr(context_api, "_RUNTIME_CONTEXT", None)
    var = getattr(runtime, "_current_context", None)
    if type(runtime).__name__ == "ContextVarsRuntimeContext" and isinstance(var, ContextVar):
        return var.get, var.set, var.reset
    return context_api.get_current, context_api.attach, context_api.detach


_current_context = context_ops()[0]
_new_object = object.__new__


def _batch_emit(processor: Any) -> Callable:
    """What a BatchSpanProcessor's ``on_end`` hands a sampled span to: its shared batch processor's ``emit``
    (SDKs since the logs/spans batching was shared), else (older SDKs) ``on_end`` itself."""
    emit = getattr(getattr(processor, "_batch_processor", None), "emit", None)
    return emit if callable(emit) else processor.on_end


def _readable_span(readable: type, name: str, context: SpanContext, parent: SpanContext | None, resource: Any,
                   attributes: dict, events: Sequence, kind: SpanKind, status: Status, start: int, end: int,
                   scope: Any) -> Any:
    """A finished ``ReadableSpan`` (``readable``), its fields set as its ``__init__`` sets them, without the
    keyword-argument call: a third of the cost, and plain attribute stores keep the fields in the instance
    (no separate ``__dict__`` object for the garbage collector to track while the span waits in the export
    queue). ``test_readable_spans_match_the_sdk`` checks the fields against the pinned SDK's."""
    span = _new_object(readable)
    span._name = name
    span._context = context
    span._kind = kind
    span._instrumentation_info = None
    span._instrumentation_scope = scope
    span._parent = parent
    span._start_time = start
    span._end_time = end
    span._attributes = attributes
    span._events = events
    span._links = ()
    span._resource = resource
    span._status = status
    return span


def _readable_span_public(readable: type, name: str, context: SpanContext, parent: SpanContext | None,
                          resource: Any, attributes: dict, events: Sequence, kind: SpanKind, status: Status,
                          start: int, end: int, scope: Any) -> Any:
    """The same span through ``ReadableSpan``'s own constructor: for an SDK whose fields differ."""
    return readable(name=name, context=context, parent=parent, resource=resource, attributes=attributes,
                    events=events, kind=kind, status=status, start_time=start, end_time=end,
                    instrumentation_scope=scope)


_BUILDERS: dict[type, Callable[..., Any]] = {}


def readable_builder(readable: type) -> Callable[..., Any]:
    """``_readable_span`` where the SDK's ``ReadableSpan.__init__`` sets exactly the fields it stores (checked
    once per class, on a sample span); else ``_readable_span_public``, the constructor (an SDK that renamed
    or added a field)."""
    builder = _BUILDERS.get(readable)
    if builder is None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        # every field set, as the fast path sets them (the constructor replaces a None resource)
        sample = ("n", SpanContext(1, 2, False, _SAMPLED), SpanContext(1, 3, True, _SAMPLED), Resource.get_empty(),
                  {"k": "v"}, (), SpanKind.SERVER, _UNSET, 1, 2, InstrumentationScope(SCOPE_NAME, SCOPE_VERSION))
        try:
            same = vars(_readable_span(readable, *sample)) == vars(_readable_span_public(readable, *sample))
        except Exception:  # noqa: BLE001 - a constructor that does not take these: the plain path decides
            same = False
        builder = _BUILDERS[readable] = _readable_span if same else _readable_span_public
    return builder


class Root(NamedTuple):
    """The request's root span as decided at start: ids, sampling, and the context to make current (a
    tuple: ``begin`` builds one per request without the constructor's Python call)."""

    context: context_api.Context
    span_context: SpanContext
    parent: SpanContext | None
    sampled: bool
    sampler_attributes: Any = None
    live_span: Any = None  # the API span, on the plain path only
    name: str = ""  # the span's name, built once at start


_new_root = functools.partial(tuple.__new__, Root)


class _FastPath:
    def __init__(self, provider: Any) -> None:
        from opentelemetry.sdk.trace import Event, ReadableSpan, SynchronousMultiSpanProcessor
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.sdk.trace.sampling import Decision
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self._sampler = provider.sampler
        self._ids = ids = provider.id_generator
        # the SDK's default generator is random.getrandbits with a retry on the invalid id 0: called directly
        # (two Python calls less per request; ``begin`` asks the generator itself on a 0, so its ids, and a
        # valid parent's trace id, are always valid)
        self._default_ids = default = type(ids) is RandomIdGenerator
        self._trace_id = functools.partial(random.getrandbits, 128) if default else ids.generate_trace_id
        self._span_id = functools.partial(random.getrandbits, 64) if default else ids.generate_span_id
        self._sampled_decision = Decision.RECORD_AND_SAMPLE
        self.resource = provider.resource  # the provider's: also where Instrumentation.region looks
        self._processor = provider._active_span_processor  # noqa: SLF001 - pinned SDK, see module doc
        # the provider's processors, when it is the SDK's own multi-processor: their tuple is replaced
        # whenever one is added, so its identity says when _end must be rebuilt
        self._multi = self._processor if type(self._processor) is SynchronousMultiSpanProcessor else None
        self._batch = BatchSpanProcessor
        self._seen: Any = None
        self._end: Any = self._processor.on_end
        self._scope = InstrumentationScope(SCOPE_NAME, SCOPE_VERSION)
        self._readable = ReadableSpan
        self._build = readable_builder(ReadableSpan)
        self._event = Event

    def _ender(self) -> Any:
        """What takes a finished span: the provider's processor, or, when that is the SDK's multi-processor,
        each BatchSpanProcessor's queue directly (every span we end is sampled: the check ``on_end`` repeats
        through four property calls is already done) and any other processor's ``on_end``."""
        multi = self._multi
        if multi is None or multi._span_processors is self._seen:  # noqa: SLF001
            return self._end
        procs = self._seen = multi._span_processors  # noqa: SLF001
        enders = tuple(_batch_emit(p) if type(p) is self._batch else p.on_end for p in procs)
        if len(enders) == 1:
            self._end = enders[0]
        else:
            def end_all(span: Any) -> None:
                for end in enders:
                    end(span)
            self._end = end_all
        return self._end

    def begin(self, name: str, parent_ctx: context_api.Context | None, start_time: int | None = None) -> Root:
        base = parent_ctx if parent_ctx is not None else _current_context()  # the context the root joins
        parent = base.get(_SPAN_KEY)  # trace.get_current_span(base), inlined
        parent = parent.get_span_context() if isinstance(parent, Span) else None
        parent = parent if parent is not None and parent.is_valid else None
        trace_id = parent.trace_id if parent else (self._trace_id() or self._ids.generate_trace_id())
        result = self._sampler.should_sample(parent_ctx, trace_id, name, SpanKind.SERVER)
        sampled = result.decision is self._sampled_decision  # Decision.is_sampled(), without the call
        span_id = self._span_id() or self._ids.generate_span_id()
        span_context = _new_span_context((  # SpanContext(...) without its keyword parsing: same fields
            trace_id, span_id, False, _SAMPLED if sampled else _NOT_SAMPLED,
            result.trace_state if result.trace_state is not None else DEFAULT_TRACE_STATE,
            self._default_ids or (0 < trace_id <= _TRACE_ID_MAX and 0 < span_id <= _SPAN_ID_MAX)))
        values = base.copy()  # trace.set_span_in_context(span, base), inlined
        values[_SPAN_KEY] = NonRecordingSpan(span_context)
        return _new_root((Context(values), span_context, parent, sampled, result.attributes or None, None, name))

    def child_context(self, root: Root) -> tuple[SpanContext, context_api.Context]:
        sc = root.span_context
        span_id = self._span_id() or self._ids.generate_span_id()
        child = _new_span_context((sc[0], span_id, False, sc[3], sc[4],  # as in begin: SpanContext's fields
                                   sc[5] and (self._default_ids or 0 < span_id <= _SPAN_ID_MAX)))
        values = root.context.copy()  # trace.set_span_in_context(span, root.context), inlined
        values[_SPAN_KEY] = NonRecordingSpan(child)
        return child, Context(values)

    def emit(self, root: Root, name: str, start: int, end: int, attributes: dict, events: Sequence,
             error: str | None, stages: Sequence[tuple]) -> None:
        if root.sampler_attributes:
            attributes.update(root.sampler_attributes)
        status = Status(StatusCode.ERROR, error) if error else _UNSET
        on_end, readable, resource, scope = self._ender(), self._readable, self.resource, self._scope
        root_sc, event, build = root.span_context, self._event, self._build
        for stage_name, span_context, s_start, s_end, s_attrs, s_events in stages:
            if s_events:
                s_events = [event(n, a, t) for n, a, t in s_events]
            on_end(build(readable, stage_name, span_context, root_sc, resource, s_attrs, s_events,
                         SpanKind.INTERNAL, _UNSET, s_start, s_end, scope))
        if events:
            events = [event(n, a, t) for n, a, t in events]
        on_end(build(readable, name, root_sc, root.parent, resource, attributes, events, SpanKind.SERVER,
                     status, start, end, scope))


    def emit_record(self, root: Root, name: str, start: int, end: int, attributes: dict, error: str | None) -> None:
        """The root span alone, for a trace the sampler dropped: the request's record for the metrics path.

        It is exported with the sampled flag (span processors drop anything else) and marked record-only;
        the context propagated downstream stays not-sampled, and no child span is built."""
        sc = root.span_context  # a copy with the sampled flag (ids already checked when sc was built)
        record_sc = _new_span_context((sc[0], sc[1], False, _SAMPLED, sc[4], sc[5]))  # tuple order, as above
        attributes[RECORD_ONLY] = True
        status = Status(StatusCode.ERROR, error) if error else _UNSET
        self._ender()(self._build(self._readable, name, record_sc, root.parent, self.resource, attributes, (),
                                  SpanKind.SERVER, status, start, end, self._scope))

    def emit_record_child(self, root: Root, name: str, start: int, end: int, attributes: dict,
                          events: Sequence) -> None:
        """A child span of a sampled-out root, exported alone with the sampled flag and marked record-only (as
        ``emit_record``): a late evaluation result, which the pipeline needs whatever the trace sampler kept."""
        sc = root.span_context
        span_id = self._span_id() or self._ids.generate_span_id()
        child = _new_span_context((sc[0], span_id, False, _SAMPLED, sc[4],
                                   sc[5] and (self._default_ids or 0 < span_id <= _SPAN_ID_MAX)))
        self._ender()(self._build(
            self._readable, name, child, sc, self.resource, {**attributes, RECORD_ONLY: True},
            [self._event(n, a, t) for n, a, t in events], SpanKind.INTERNAL, _UNSET, start, end, self._scope))

    def emit_child(self, root: Root, name: str, span_context: SpanContext, start: int, end: int,
                   attributes: dict, events: Sequence) -> None:
        self._ender()(self._build(
            self._readable, name, span_context, root.span_context, self.resource, attributes,
            [self._event(n, a, t) for n, a, t in events], SpanKind.INTERNAL, _UNSET, start, end, self._scope))


class _PlainPath:
    """Any non-SDK tracer provider: the ordinary API calls (stage spans created at request end)."""

    def __init__(self, provider: Any) -> None:
        self._tracer = provider.get_tracer(SCOPE_NAME, SCOPE_VERSION)

    def begin(self, name: str, parent_ctx: context_api.Context | None, start_time: int | None = None) -> Root:
        span = self._tracer.start_span(name, context=parent_ctx, kind=SpanKind.SERVER, start_time=start_time)
        parent = trace.get_current_span(parent_ctx).get_span_context()
        return Root(trace.set_span_in_context(span, parent_ctx), span.get_span_context(),
                    parent if parent.is_valid else None, span.is_recording(), live_span=span, name=name)

    def child_context(self, root: Root) -> tuple[SpanContext | None, context_api.Context]:
        return None, root.context

    def emit_record(self, root: Root, name: str, start: int, end: int, attributes: dict, error: str | None) -> None:
        """Nothing: through the plain API an unsampled span cannot be exported (a non-SDK provider)."""

    def emit_record_child(self, root: Root, name: str, start: int, end: int, attributes: dict,
                          events: Sequence) -> None:
        """Nothing: through the plain API an unsampled span cannot be exported (a non-SDK provider)."""

    def emit_child(self, root: Root, name: str, span_context: SpanContext | None, start: int, end: int,
                   attributes: dict, events: Sequence) -> None:
        """A finished child span of ``root`` (its ids are the tracer's: ``span_context`` is None here)."""
        span = self._tracer.start_span(name, context=root.context, start_time=start, attributes=attributes)
        for ev_name, ev_attrs, ev_time in events:
            span.add_event(ev_name, ev_attrs, ev_time)
        span.end(end_time=end)

    def emit(self, root: Root, name: str, start: int, end: int, attributes: dict, events: Sequence,
             error: str | None, stages: Sequence[tuple]) -> None:
        span = root.live_span
        for stage_name, _sc, s_start, s_end, s_attrs, s_events in stages:
            child = self._tracer.start_span(stage_name, context=root.context, start_time=s_start,
                                            attributes=s_attrs)
            for ev_name, ev_attrs, ev_time in s_events:
                child.add_event(ev_name, ev_attrs, ev_time)
            child.end(end_time=s_end)
        span.update_name(name)
        span.set_attributes(attributes)
        for ev_name, ev_attrs, ev_time in events:
            span.add_event(ev_name, ev_attrs, ev_time)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end)


class SpanSink:
    """Chooses the fast or plain path for the current tracer provider (re-checked when it changes)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self._explicit = tracer_provider
        self._provider: Any = None
        self.path: _FastPath | _PlainPath | None = None

    def current(self) -> _FastPath | _PlainPath:
        provider = self._explicit or trace.get_tracer_provider()
        if provider is not self._provider or self.path is None:
            self._provider = provider
            self.path = _FastPath(provider) if _is_sdk(provider) else _PlainPath(provider)
        return self.path


def _is_sdk(provider: Any) -> bool:
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError:  # only the API installed
        return False
    return (isinstance(provider, TracerProvider) and not getattr(provider, "_disabled", False)
            and _SPAN_KEY is not None and all(hasattr(provider, name) for name in _SDK_PROVIDER_FIELDS))


# what _FastPath reads from an SDK TracerProvider (without any of them: the plain path)
_SDK_PROVIDER_FIELDS = ("_active_span_processor", "sampler", "id_generator", "resource")
