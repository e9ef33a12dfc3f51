"""PyFlink wiring of the quality job: the metrics job's quality signals and evaluation batches read into per-key,
per-window partials (``ReadBatches``, one per source), then one keyed engine per (region, model) that closes its
windows in window order when the watermark passes them (``QualityWindows``). The logic is ``stream``'s; this module
keeps state, timers and Flink metrics. Its own module so Flink pickles the functions by reference (the job module
runs as ``__main__`` under ``flink run``)."""

from __future__ import annotations

import pickle
from typing import Any

from pyflink.common import Row, Types
from pyflink.datastream import KeyedProcessFunction, ProcessFunction
from pyflink.datastream.functions import RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from infersight.flink_jobs.common.cardinality import DEFAULT_SPAN_MS, LabelLimiter
from infersight.flink_jobs.common.deadletter import dead_letter
from infersight.flink_jobs.common.state_ttl import expiring
from infersight.flink_jobs.quality.core import EngineParams
from infersight.flink_jobs.quality.stream import (
    JOB,
    LABELS,
    QualityState,
    event_json,
    load_pinned,
    merge,
    output_key,
    read_evaluations,
    read_requests,
    read_signals,
)

SIGNALS_KIND, EVALUATIONS_KIND, REQUESTS_KIND = "signals", "evaluations", "requests"
KINDS = (SIGNALS_KIND, EVALUATIONS_KIND, REQUESTS_KIND)


class ReadBatches(ProcessFunction):
    """One message of ``infersight.quality_signals`` (``kind`` "signals": the metrics job's per series and window),
    ``infersight.evaluations`` ("evaluations") or request records (``infersight.requests``, "requests": the
    reference path, not wired in the job) -> one ``(engine key, window end ms, requests or results, partial)`` per
    key and window in it; dead letters on ``dlq_tag`` (a message that is not JSON, each record breaking the
    contract, or a message the aggregation failed on: never a crash loop). Labels past their cardinality bound are
    folded into ``_OTHER`` (Flink counters ``folded_<label>``). One element per key and window, not per record:
    PyFlink pays per element."""

    def __init__(self, kind: str, window_s: int, dlq_tag: Any, topic: str, limits: dict[str, int] | None = None,
                 span_ms: int = DEFAULT_SPAN_MS) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind, self.window_s, self.dlq_tag, self.topic = kind, int(window_s), dlq_tag, topic
        self.limits, self.span_ms = limits, span_ms

    def open(self, runtime_context: RuntimeContext) -> None:
        group = runtime_context.get_metrics_group()
        self.records, self.dead = group.counter("records"), group.counter("dead_letters")
        self.unscored = group.counter("unscored_evaluations")
        self.limiter = LabelLimiter(self.limits, self.span_ms, LABELS) if self.limits else None
        self.folded = {label: group.counter(f"folded_{label}") for label in (self.limits or ())}
        self.reported = dict.fromkeys(self.folded, 0)

    def read(self, value: str, now_ms: int) -> tuple[dict, list[str], int]:
        limiter = self.limiter
        fold = None if limiter is None else limiter.batch_fold(now_ms)
        try:
            if self.kind == SIGNALS_KIND:
                partials, letters = read_signals(value, self.window_s, fold, self.topic)
                return partials, letters, 0
            if self.kind == REQUESTS_KIND:
                partials, letters = read_requests(value, self.window_s, fold, self.topic)
                return partials, letters, 0
            return read_evaluations(value, self.window_s, fold, self.topic)
        except Exception as exc:  # noqa: BLE001 - a record the contract let through and the aggregation did not
            return {}, [dead_letter(JOB, f"unprocessable: {type(exc).__name__}: {exc}", value, topic=self.topic)], 0

    def process_element(self, value: str, ctx: ProcessFunction.Context):
        partials, letters, unscored = self.read(value, ctx.timer_service().current_processing_time())
        if self.limiter is not None:
            for label, n in self.limiter.folded.items():
                if n != self.reported[label]:
                    self.folded[label].inc(n - self.reported[label])
                    self.reported[label] = n
        if unscored:
            self.unscored.inc(unscored)
        if letters:
            self.dead.inc(len(letters))
            for letter in letters:
                yield self.dlq_tag, letter
        for (key, end_ms), (n, partial) in partials.items():
            self.records.inc(n)
            yield key, end_ms, n, partial


class QualityWindows(KeyedProcessFunction):
    """Keyed by (region, model): partials wait in map state (window end ms -> (records, merged partial)) until the
    watermark passes their window, then the key's engine (pickled in value state) closes every due window in order and
    emits ``("event", Row(key, JSON))`` per quality record or drift event and ``("metrics", bytes)`` per window.
    A partial whose window has already closed is late: counted (``late_records``), never fed out of order.
    Every state carries a processing-time TTL (``ttl_s``): a model silent in a region that long loses its
    engine, baselines included."""

    def __init__(self, params: EngineParams, ttl_s: float = 0.0, pinned_path: str | None = None) -> None:
        self.params, self.ttl_s, self.pinned_path = params, ttl_s, pinned_path

    def open(self, runtime_context: RuntimeContext) -> None:
        self.pending = runtime_context.get_map_state(
            expiring(MapStateDescriptor("pending", Types.LONG(), Types.PICKLED_BYTE_ARRAY()), self.ttl_s))
        self.engine = runtime_context.get_state(
            expiring(ValueStateDescriptor("engine", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))
        self.last_end_ms = runtime_context.get_state(expiring(ValueStateDescriptor("last_end_ms", Types.LONG()),
                                                              self.ttl_s))
        group = runtime_context.get_metrics_group()
        self.late = group.counter("late_records")
        self.closed = group.counter("windows_closed")
        self.pinned = load_pinned(self.pinned_path) if self.pinned_path else None

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        _key, end_ms, n, partial = value
        last = self.last_end_ms.value()
        if end_ms - 1 <= ctx.timer_service().current_watermark() or (last is not None and end_ms <= last):
            self.late.inc(n)
            return
        waiting_n, waiting = self.pending.get(end_ms) or (0, None)
        self.pending.put(end_ms, (waiting_n + n, merge(waiting, partial)))
        ctx.timer_service().register_event_time_timer(end_ms - 1)  # the window's last millisecond, as Flink's

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        due = sorted(k for k in self.pending.keys() if k - 1 <= timestamp)
        if not due:  # an earlier timer closed these windows with its own (the watermark jumped past several)
            return
        raw = self.engine.value()
        state = QualityState(pickle.loads(raw) if raw else None, self.params, self.pinned)
        for end_ms in due:
            n, partial = self.pending.get(end_ms)
            self.pending.remove(end_ms)
            if state.last_end is not None and end_ms // 1000 <= state.last_end:  # never fed out of order
                self.late.inc(n)
                continue
            outputs, metrics = state.close(end_ms // 1000, partial)
            self.closed.inc()
            for out in outputs:
                yield "event", Row(output_key(out), event_json(out))
            if metrics is not None:
                yield "metrics", metrics
        self.engine.update(pickle.dumps(state.to_state(), protocol=pickle.HIGHEST_PROTOCOL))
        self.last_end_ms.update(due[-1])


def engine_key_of(t: Any) -> str:
    return t[0]


def is_tag(tag: str):
    return lambda t: t[0] == tag


def second(t: Any) -> Any:
    return t[1]
