"""Per-call latency of a compiled module: a histogram for every call, a span only inside sampled traces.

    model = instrument_module(torch.compile(model), "decoder")
    logits = model(tokens)        # records infersight.torch_compile.call.duration

Calls that triggered a (re)compile are tagged ``infersight.torch_compile.compiled_during_call=true`` (when the
compile watcher is installed), so a dashboard can separate steady-state latency from compile stalls.
"""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from infersight.instrumentation.meters import histogram
from infersight.instrumentation.torch_compile.watcher import SCOPE_NAME, current_watcher
from infersight.schemas import attributes as A
from infersight.schemas import torch_compile as N
from infersight.schemas.attributes import SCOPE_VERSION
from infersight.schemas.units import NS

_NS_F = float(NS)  # seconds = ns / 1e9 on every call: a float divisor is the cheaper division


class InstrumentedModule:
    """Wraps a callable (usually the result of ``torch.compile``); attribute access passes through."""

    def __init__(self, fn: Any, name: str, tracer_provider: Any = None, meter_provider: Any = None) -> None:
        self._fn, self.name = fn, name
        self._tracer = (tracer_provider or trace.get_tracer_provider()).get_tracer(SCOPE_NAME, SCOPE_VERSION)
        meter = (meter_provider or metrics.get_meter_provider()).get_meter(SCOPE_NAME, SCOPE_VERSION)
        self._hist = histogram(meter, N.CALL_DURATION, "s", "Latency of one call of a compiled module",
                               N.CALL_BUCKETS)
        self._attrs = {flag: {N.MODULE: name, N.COMPILED_DURING_CALL: flag} for flag in (False, True)}
        self._span_name = f"torch.compile.call {name}"
        self.calls = 0

    def __getattr__(self, item: str) -> Any:
        return getattr(self._fn, item)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        watcher = current_watcher()
        compiles_before = watcher.compiles_on_this_thread() if watcher is not None else 0
        parent = trace.get_current_span().get_span_context()
        sampled = parent.is_valid and parent.trace_flags.sampled
        wall0 = time.time_ns() if sampled else 0
        t0 = time.perf_counter_ns()
        error: BaseException | None = None
        try:
            return self._fn(*args, **kwargs)
        except BaseException as exc:
            error = exc
            raise
        finally:
            elapsed = time.perf_counter_ns() - t0
            self.calls += 1
            try:
                compiled = watcher is not None and watcher.compiles_on_this_thread() != compiles_before
                attrs = self._attrs[compiled]
                if error is not None:
                    attrs = {**attrs, A.ERROR_TYPE: type(error).__qualname__}
                self._hist.record(elapsed / _NS_F, attrs)
                if sampled:
                    span = self._tracer.start_span(self._span_name, kind=SpanKind.INTERNAL, attributes=attrs,
                                                   start_time=wall0)
                    if error is not None:
                        span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
                    span.end(end_time=wall0 + elapsed)
            except Exception:  # noqa: BLE001 - telemetry never fails the call
                pass


def instrument_module(fn: Any, name: str = "model", *, tracer_provider: Any = None,
                      meter_provider: Any = None) -> InstrumentedModule:
    """Wrap ``fn`` (a compiled module or function) to record its per-call latency."""
    return InstrumentedModule(fn, name, tracer_provider, meter_provider)
