"""Compile and recompile events from torch's own hooks, as spans and metrics.

The hook: every Dynamo compile ends in ``torch._dynamo.utils.record_compilation_metrics``, which builds a
``CompilationMetrics`` record (compile id, frame, start/duration, ``recompile_reason``, failure type) and
hands it to ``torch._dynamo.utils.log_compilation_event`` (torch's logging hook, on while
``torch._dynamo.config.log_compilation_metrics`` is True, the default). We wrap that function (looked
up at call time, so the wrap holds) and add graph-break counts from ``torch._dynamo.utils.counters``.

Not used, and why: ``torch._dynamo.on_compile_start/on_compile_end`` callbacks carry only a compile id
(no duration, no reason) and ``torch._dynamo.reset()`` clears them; structured trace logging
(``TORCH_TRACE``) computes every graph dump when a handler is attached.

A compile runs on the thread that called the compiled function, inside its call, so the compile span is
a child of whatever span is current there (e.g. the request that hit the recompile).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from infersight.instrumentation.meters import histogram
from infersight.schemas import attributes as A
from infersight.schemas import torch_compile as N
from infersight.schemas.attributes import SCOPE_VERSION
from infersight.schemas.units import NS

_log = logging.getLogger(__name__)
SCOPE_NAME = __package__  # infersight.instrumentation.torch_compile


@dataclass(frozen=True)
class CompileEvent:
    """One Dynamo compile, from torch's ``CompilationMetrics`` (fields read defensively)."""

    compile_id: str
    frame: str
    kind: str                      # "compile" or "recompile"
    start_ns: int                  # wall clock, ns since the epoch
    duration_s: float
    recompile_reason: str | None = None
    graph_breaks: int = 0
    graph_break_reasons: tuple[str, ...] = ()
    fail_type: str | None = None
    fail_reason: str | None = None
    graph_ops: int | None = None

    @property
    def end_ns(self) -> int:
        return self.start_ns + int(self.duration_s * NS)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def event_from_metrics(m: Any, graph_break_reasons: tuple[str, ...] = ()) -> CompileEvent | None:
    """A CompileEvent from a ``CompilationMetrics``; None for records that are not a frame compile."""
    if getattr(m, "is_runtime", False):  # runtime records (autotuning, cudagraphs) are not compiles
        return None
    start_us, end_us = _int(getattr(m, "start_time_us", None)), _int(getattr(m, "end_time_us", None))
    duration_us = _int(getattr(m, "duration_us", None))
    if duration_us is None and start_us is not None and end_us is not None:
        duration_us = end_us - start_us
    if start_us is None or duration_us is None or duration_us < 0:
        return None
    compile_id = str(getattr(m, "compile_id", None) or "?")
    reason = getattr(m, "recompile_reason", None)
    attempt = compile_id.split("/")[1] if "/" in compile_id else "0"
    kind = "recompile" if reason or (attempt.isdigit() and int(attempt) > 0) else "compile"
    fail_type = getattr(m, "fail_type", None)
    return CompileEvent(compile_id=compile_id, frame=str(getattr(m, "co_name", None) or "?"), kind=kind,
                        start_ns=start_us * 1000, duration_s=duration_us / 1e6,
                        recompile_reason=str(reason) if reason else None,
                        graph_breaks=len(graph_break_reasons), graph_break_reasons=graph_break_reasons,
                        fail_type=str(fail_type) if fail_type else None,
                        fail_reason=str(getattr(m, "fail_reason", None) or "")[:500] or None,
                        graph_ops=_int(getattr(m, "graph_op_count", None)))


def reason_category(reason: Any) -> str:
    """First line of a graph-break reason, bounded (a metric dimension)."""
    return str(reason).strip().splitlines()[0][:120] if str(reason).strip() else "unknown"


CompileHook = Callable[[CompileEvent], None]


class CompileWatcher:
    """Turns compile events into a span (for the sampler to keep or drop) and metrics (always)."""

    def __init__(self, tracer_provider: Any = None, meter_provider: Any = None,
                 compile_hook: CompileHook | None = None) -> None:
        tp = tracer_provider or trace.get_tracer_provider()
        mp = meter_provider or metrics.get_meter_provider()
        self._tracer = tp.get_tracer(SCOPE_NAME, SCOPE_VERSION)
        meter = mp.get_meter(SCOPE_NAME, SCOPE_VERSION)
        self._duration = histogram(meter, N.COMPILE_DURATION, "s", "Duration of one Dynamo compile",
                                   N.COMPILE_BUCKETS)
        self._count = meter.create_counter(N.COMPILES, unit="{compile}", description="Compiles and recompiles")
        self._breaks = meter.create_counter(N.GRAPH_BREAK_COUNT, unit="{break}", description="Graph breaks")
        self._hook = compile_hook
        self._seen_breaks: dict[str, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self.events_seen = 0

    def compiles_on_this_thread(self) -> int:
        """Compiles finished on the calling thread so far (for tagging calls that compiled)."""
        return getattr(self._local, "n", 0)

    def _new_graph_breaks(self) -> tuple[str, ...]:
        try:
            from torch._dynamo.utils import counters

            current = dict(counters["graph_break"])
        except Exception:  # noqa: BLE001
            return ()
        new: list[str] = []
        with self._lock:
            for reason, count in current.items():
                seen = self._seen_breaks.get(reason, 0)
                if count > seen:
                    new += [reason_category(reason)] * (count - seen)
                self._seen_breaks[reason] = count
            if len(current) < len(self._seen_breaks):  # torch._dynamo.reset() cleared the counters
                self._seen_breaks = dict(current)
        return tuple(new)

    def on_compilation_metrics(self, m: Any) -> None:
        """Called with each ``CompilationMetrics``; never raises."""
        try:
            event = event_from_metrics(m, self._new_graph_breaks())
            if event is None:
                return
            self._local.n = self.compiles_on_this_thread() + 1
            self.events_seen += 1
            self.emit(event)
        except Exception:  # noqa: BLE001 - telemetry must not break compilation
            _log.warning("infersight: could not record a torch.compile event", exc_info=True)

    def emit(self, event: CompileEvent) -> None:
        attrs: dict[str, Any] = {N.COMPILE_KIND: event.kind}
        if event.fail_type:
            attrs[A.ERROR_TYPE] = event.fail_type
        self._duration.record(event.duration_s, attrs)
        self._count.add(1, attrs)
        for reason in event.graph_break_reasons:
            self._breaks.add(1, {N.GRAPH_BREAK_REASON: reason})
        span_attrs: dict[str, Any] = {**attrs, N.COMPILE_ID: event.compile_id, N.FRAME: event.frame,
                                      N.GRAPH_BREAKS: event.graph_breaks}
        if event.recompile_reason:
            span_attrs[N.RECOMPILE_REASON] = event.recompile_reason[:1000]
        if event.graph_break_reasons:
            span_attrs[N.GRAPH_BREAK_REASONS] = list(dict.fromkeys(event.graph_break_reasons))
        if event.graph_ops is not None:
            span_attrs[N.GRAPH_OPS] = event.graph_ops
        span = self._tracer.start_span(f"torch.compile {event.frame}", kind=SpanKind.INTERNAL,
                                       attributes=span_attrs, start_time=event.start_ns)
        if event.fail_type:
            span.set_status(Status(StatusCode.ERROR, (event.fail_reason or event.fail_type)[:200]))
        span.end(end_time=max(event.end_ns, event.start_ns))
        if self._hook is not None:
            try:
                self._hook(event)
            except Exception:  # noqa: BLE001
                _log.exception("infersight: the torch.compile compile_hook raised; ignored")


_watcher: CompileWatcher | None = None
_install_lock = threading.Lock()


def current_watcher() -> CompileWatcher | None:
    return _watcher


def _wrapper(wrapped, instance, args, kwargs):
    result = wrapped(*args, **kwargs)
    watcher = _watcher
    if watcher is not None and args:
        watcher.on_compilation_metrics(args[0])
    return result


def install(watcher: CompileWatcher) -> None:
    """Route torch's compile records to ``watcher`` (imports torch._dynamo; idempotent)."""
    global _watcher
    import torch._dynamo.utils as dynamo_utils
    from wrapt import wrap_function_wrapper

    with _install_lock:
        _watcher = watcher
        watcher._new_graph_breaks()  # breaks from before we were watching are not ours
        if not hasattr(dynamo_utils.log_compilation_event, "__wrapped__"):
            wrap_function_wrapper(dynamo_utils, "log_compilation_event", _wrapper)


def uninstall() -> None:
    """Restore torch's ``log_compilation_event`` and drop the watcher."""
    global _watcher
    import sys

    with _install_lock:
        _watcher = None
        module = sys.modules.get("torch._dynamo.utils")
        if module is not None and hasattr(module.log_compilation_event, "__wrapped__"):
            module.log_compilation_event = module.log_compilation_event.__wrapped__
