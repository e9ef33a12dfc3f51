"""The metrics job's Flink functions (timestamps, window aggregates, keyed state). They live in their own
module so Flink pickles them by reference: the job module runs as ``__main__`` under ``flink run``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from pyflink.common import Types
from pyflink.datastream import KeyedProcessFunction, ProcessFunction, ProcessWindowFunction
from pyflink.datastream.functions import AggregateFunction, RuntimeContext
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor

from infersight.flink_jobs.common.cardinality import DEFAULT_SPAN_MS, GAUGE_LABELS, REQUEST_LABELS, LabelLimiter
from infersight.flink_jobs.common.keys import (
    deployment_of_series,
    deployment_rollups,
    global_key,
    region_of,
    split_timed_key,
    timed_key,
)
from infersight.flink_jobs.common.state_ttl import expiring as _expiring  # the states of series that stopped expire
from infersight.flink_jobs.metrics import client_join, core
from infersight.flink_jobs.metrics.window_stats import Cumulative, WindowStats, fact_of, window_of
from infersight.schemas.topics import PODS, REQUESTS
from infersight.schemas.units import MS, NS


class _Folding:
    """A ``LabelLimiter`` (None: no bounds) and one Flink counter per label, ``folded_<label>``: records whose
    label was folded into ``_OTHER``."""

    def __init__(self, group: Any, limits: dict[str, int] | None, span_ms: int, fields: dict[str, str]) -> None:
        self.limiter = None if limits is None else LabelLimiter(limits, span_ms, fields)
        self.counters = {label: group.counter(f"folded_{label}") for label in (limits or ())}
        self.reported = dict.fromkeys(self.counters, 0)

    def folder(self, now_ms: int):
        limiter = self.limiter
        return None if limiter is None else (lambda record: limiter.fold(record, now_ms))

    def count(self) -> None:
        if self.limiter is None:
            return
        for label, n in self.limiter.folded.items():
            if n != self.reported[label]:
                self.counters[label].inc(n - self.reported[label])
                self.reported[label] = n


class PreAggregate(ProcessFunction):
    """A batch of records (one ``infersight.requests`` message) -> one ``(timed_key(series, window end), window end
    ms, facts)`` per series and window in it (``fact_of``: only what the window needs); records whose
    window has fired go to the late output whole, as ``(series key, None, records)`` per series. One
    Flink element per group instead of one per request is what makes the job fast: PyFlink's cost is
    per element."""

    def __init__(self, window_ms: int, late_tag: Any, dlq_tag: Any, limits: dict[str, int] | None = None,
                 span_ms: int = DEFAULT_SPAN_MS, topic: str = REQUESTS.name) -> None:
        self.window_ms, self.late_tag, self.dlq_tag = window_ms, late_tag, dlq_tag
        self.limits, self.span_ms, self.topic = limits, span_ms, topic  # topic: the dead letters' source

    def open(self, runtime_context: RuntimeContext) -> None:
        group = runtime_context.get_metrics_group()
        self.records = group.counter("records")
        self.dead = group.counter("dead_letters")
        self.limiter = _Folding(group, getattr(self, "limits", None),  # None: a job pickled before the bounds
                                getattr(self, "span_ms", DEFAULT_SPAN_MS), REQUEST_LABELS)

    def process_element(self, value: str, ctx: ProcessFunction.Context):
        letters: list[str] = []
        records = core.read_batch(value, self.topic, letters)
        rejected: list = []
        groups, late = core.group_batch(records, self.window_ms, ctx.timer_service().current_watermark(), rejected,
                                        self.limiter.folder(ctx.timer_service().current_processing_time()))
        self.limiter.count()
        letters += core.dead_letters(rejected, self.topic)
        self.records.inc(len(records) - len(rejected))
        if letters:
            self.dead.inc(len(letters))
            for letter in letters:
                yield self.dlq_tag, letter
        for key, group in late.items():
            yield self.late_tag, (key, None, group)
        for (key, end_ms), group in groups.items():
            yield timed_key(key, end_ms), end_ms, [fact_of(record) for record in group]


class PreAggregatePods(ProcessFunction):
    """A batch of pod gauge points (one ``infersight.pods`` message) -> one ``(timed_key(deployment, window end),
    window end ms, [PodWindow])`` per deployment (and roll-up: ``core.group_gauges``) and window in it. Points
    whose window has fired are dropped (as a Flink window drops late elements) and counted in the
    ``late_gauges`` metric. Per batch, not per point: ~1,500 points/s at 10,000 requests/s; each group leaves
    reduced to its pods' last values."""

    def __init__(self, window_ms: int, dlq_tag: Any, limits: dict[str, int] | None = None,
                 span_ms: int = DEFAULT_SPAN_MS, topic: str = PODS.name) -> None:
        self.window_ms, self.dlq_tag, self.limits, self.span_ms = window_ms, dlq_tag, limits, span_ms
        self.topic = topic

    def open(self, runtime_context: RuntimeContext) -> None:
        group = runtime_context.get_metrics_group()
        self.late = group.counter("late_gauges")
        self.dead = group.counter("dead_letters")
        self.limiter = _Folding(group, getattr(self, "limits", None),  # None: a job pickled before the bounds
                                getattr(self, "span_ms", DEFAULT_SPAN_MS), GAUGE_LABELS)

    def process_element(self, value: str, ctx: ProcessFunction.Context):
        letters: list[str] = []
        rejected: list = []
        groups, late = core.group_gauges(core.read_batch(value, self.topic, letters), self.window_ms,
                                         ctx.timer_service().current_watermark(), rejected,
                                         self.limiter.folder(ctx.timer_service().current_processing_time()))
        self.limiter.count()
        letters += core.dead_letters(rejected, self.topic)
        if letters:
            self.dead.inc(len(letters))
            for letter in letters:
                yield self.dlq_tag, letter
        if late:
            self.late.inc(late)
        for (key, end_ms), points in groups.items():
            yield timed_key(key, end_ms), end_ms, [core.PodWindow.of(points)]


class WindowGroups(KeyedProcessFunction):
    """Per (key, window): the groups (lists) in list state until the watermark passes the window's end,
    then ``(key, window end ns, reduce(every item))`` stamped with the window's last millisecond (as a
    Flink window's result is). For requests the items are facts and ``reduce`` builds the WindowStats:
    keeping facts rather than an incremental aggregate, because updating a sketch accumulator in state
    re-pickles five sketches (~20 KB) per update."""

    def __init__(self, reduce: Callable[[Iterable[Any]], Any]) -> None:
        self.reduce = reduce

    def open(self, runtime_context: RuntimeContext) -> None:
        self.groups = runtime_context.get_list_state(ListStateDescriptor("groups", Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        self.groups.add(value[2])
        ctx.timer_service().register_event_time_timer(value[1] - 1)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        key, end_ms = split_timed_key(ctx.get_current_key())
        result = self.reduce(item for group in (self.groups.get() or ()) for item in group)
        self.groups.clear()
        yield key, end_ms * MS, result


class MergeAggregate(AggregateFunction):
    """Merges regional window results (``(key, end_ns, WindowStats)``, a few per window) into the roll-up."""

    def create_accumulator(self) -> WindowStats:
        return WindowStats()

    def add(self, value: Any, accumulator: WindowStats) -> WindowStats:
        return accumulator.merge(value[2])

    def get_result(self, accumulator: WindowStats) -> WindowStats:
        return accumulator

    def merge(self, a: WindowStats, b: WindowStats) -> WindowStats:
        return a.merge(b)


class WithWindowEnd(ProcessWindowFunction):
    """``(key, window end ns, aggregate)``; the element's timestamp is the window's last millisecond."""

    def process(self, key: str, context: ProcessWindowFunction.Context, elements: Any):
        for aggregate in elements:
            yield key, context.window().end * MS, aggregate


class CumulateSeries(KeyedProcessFunction):
    """Per series: running totals across windows -> one OTLP batch per window. Late records (``end_ns``
    None) join the running totals without a batch of their own: counters and cumulative histograms count
    every request, only the per-window gauges and quantiles miss the late ones. The series' next window
    shows them; when none comes within ``flush_windows`` windows (processing time: the series stopped), a
    batch of the totals alone does, stamped 1 ms after the series' last batch (Prometheus takes a series'
    samples only in time order, and the next window, if one comes after all, ends later still)."""

    def __init__(self, window_ns: int, flush_windows: int = 2, ttl_s: float = 0.0) -> None:
        self.window_ns, self.ttl_s = window_ns, ttl_s
        self.flush_ms = flush_windows * window_ns // MS

    def open(self, runtime_context: RuntimeContext) -> None:
        self.totals = runtime_context.get_state(
            _expiring(ValueStateDescriptor("totals", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))
        # (stamp of the series' last batch or None, late records not shown yet)
        self.shown = runtime_context.get_state(
            _expiring(ValueStateDescriptor("shown", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        key, end_ns, stats = value[:3]
        if end_ns is None:  # a late record: into the running totals, shown with the series' next window
            totals = self.totals.value() or Cumulative(value[3] // self.window_ns * self.window_ns)
            self.totals.update(totals.add_window(stats))
            last_ns, pending = self.shown.value() or (None, False)
            if not pending:  # one flush timer however many late batches come
                timers = ctx.timer_service()
                timers.register_processing_time_timer(timers.current_processing_time() + self.flush_ms)
                self.shown.update((last_ns, True))
            return
        totals = self.totals.value() or Cumulative(end_ns - self.window_ns)
        totals.add_window(stats)
        self.totals.update(totals)
        self.shown.update((end_ns, False))
        yield core.encode_window(key, end_ns, stats, totals)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        last_ns, pending = self.shown.value() or (None, False)
        totals = self.totals.value()
        if not pending or totals is None:  # a window showed them meanwhile
            return
        stamp = last_ns + MS if last_ns is not None else totals.start_ns + self.window_ns
        self.shown.update((stamp, False))
        yield core.encode_totals(ctx.get_current_key(), stamp, totals)


class CumulatePods(KeyedProcessFunction):
    """Per deployment (or roll-up): pod gauge stats and cumulative cost; also emits ("cost", key, $) for unit
    cost."""

    def __init__(self, window_ns: int, pricing: core.Pricing, ttl_s: float = 0.0) -> None:
        self.window_ns, self.pricing, self.ttl_s = window_ns, pricing, ttl_s

    def open(self, runtime_context: RuntimeContext) -> None:
        self.totals = runtime_context.get_state(
            _expiring(ValueStateDescriptor("cost", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        key, end_ns, pods = value
        totals = self.totals.value() or {"gpu_seconds": 0.0, "cost_usd": 0.0, "idle_usd": 0.0,
                                         "start_ns": end_ns - self.window_ns}
        gpu_s, cost, idle = pods.cost(self.window_ns / NS, self.pricing)
        totals["gpu_seconds"] += gpu_s
        totals["cost_usd"] += cost
        totals["idle_usd"] += idle
        self.totals.update(totals)
        yield "metrics", key, core.encode_pods(key, end_ns, pods, totals, totals["start_ns"])
        yield "cost", key, cost


class UnitCost(ProcessWindowFunction):
    """Joins a deployment's (or roll-up's) window cost and output tokens: ``[$, tokens]`` -> $ per 1M output
    tokens."""

    def process(self, key: str, context: ProcessWindowFunction.Context, elements: Any):
        for cost, tokens in elements:
            encoded = core.encode_unit_cost(key, context.window().end * MS, cost, int(tokens))
            if encoded is not None:
                yield encoded


class SumPair(AggregateFunction):
    def create_accumulator(self) -> list[float]:
        return [0.0, 0.0]

    def add(self, value: Any, acc: list[float]) -> list[float]:
        acc[0 if value[0] == "cost" else 1] += value[2]
        return acc

    def get_result(self, acc: list[float]) -> list[float]:
        return acc

    def merge(self, a: list[float], b: list[float]) -> list[float]:
        return [a[0] + b[0], a[1] + b[1]]


class CountLate(KeyedProcessFunction):
    """Per region: how many records missed their window, as a cumulative counter. Emitted at most once a
    second (a processing-time timer), however many late records arrive: a late backlog must not flood
    the sink with one message per record. Stamped when emitted, strictly increasing per region
    (Prometheus refuses two values at one timestamp)."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.count = runtime_context.get_state(ValueStateDescriptor("late", Types.PICKLED_BYTE_ARRAY()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        count, start_ns, last_ns = self.count.value() or (0, time.time_ns(), 0)
        self.count.update((count + len(value[2]), start_ns, last_ns))
        now_ms = ctx.timer_service().current_processing_time()
        ctx.timer_service().register_processing_time_timer((now_ms // 1000 + 1) * 1000)  # same second: one timer

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        count, start_ns, last_ns = self.count.value()
        stamp = max(time.time_ns() // MS * MS, last_ns + MS)  # ms: Prometheus' resolution
        self.count.update((count, start_ns, stamp))
        yield core.encode_late(ctx.get_current_key(), count, start_ns, stamp)


def output_tokens(t: Any):
    """A regional window's output tokens -> ``("tokens", key, n)`` for its deployment and the roll-ups (what the
    pods' cost of each key is divided by)."""
    tokens = float(t[2].tokens["output"])
    for key in deployment_rollups(deployment_of_series(t[0])):
        yield "tokens", key, tokens


def late_series(t: Any):
    """A series' late records ``(key, None, records)`` -> their contribution to the series' and the roll-up's
    running totals (copies of a request counted once, as in a window)."""
    stats = window_of(t[2])
    first_end = min(r["end_ns"] for r in t[2])
    yield t[0], None, stats, first_end
    yield global_key(t[0]), None, stats, first_end


def late_json(t: Any):
    for record in t[2]:
        yield json.dumps(record, separators=(",", ":"))


def first(t: Any) -> Any:
    return t[0]


def global_key_of(t: Any) -> str:
    return global_key(t[0])


def late_region(t: Any) -> str:
    return region_of(t[0])


def second(t: Any) -> Any:
    return t[1]


def third(t: Any) -> Any:
    return t[2]


def is_metrics(t: Any) -> bool:
    return t[0] == "metrics"


def is_cost(t: Any) -> bool:
    return t[0] == "cost"


class WindowStatsRecords:
    """Windows (``(key, end ns, WindowStats | PodWindow)``) -> their window-stats JSON records for the detect
    job (``detection_signals``); a picklable callable for ``flat_map``."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s

    def __call__(self, t: Any):
        from infersight.flink_jobs.metrics import detection_signals as D

        key, end_ns, window = t
        if isinstance(window, WindowStats):
            yield D.request_record(key, end_ns, window, self.window_s)
        else:
            out = D.pod_record(key, end_ns, window.stats())
            if out is not None:
                yield out


# ---- the client TTFT join (issue #22): client_join is the pure part ----

class ParseClientCalls(ProcessFunction):
    """One ``infersight.client_calls`` message -> ``(trace id, half)`` per valid half; a dead letter (side output)
    for the message when it is not a JSON batch and for each half that breaks the contract."""

    def __init__(self, dlq_tag: Any, topic: str) -> None:
        self.dlq_tag, self.topic = dlq_tag, topic

    def open(self, runtime_context: RuntimeContext) -> None:
        group = runtime_context.get_metrics_group()
        self.halves = group.counter("client_call_halves")
        self.dead = group.counter("dead_letters")

    def process_element(self, value: str, ctx: ProcessFunction.Context):
        letters: list[str] = []
        halves = client_join.read_halves(value, letters, self.topic)
        if letters:
            self.dead.inc(len(letters))
            for letter in letters:
                yield self.dlq_tag, letter
        self.halves.inc(len(halves))
        for half in halves:
            yield half["trace_id"], half


class JoinClientCalls(KeyedProcessFunction):
    """Per trace: its client and server halves joined (``client_join.add``), those that waited ``timeout_ms``
    expired by a processing-time timer (``client_join.expire``) -> ``(totals key, Joined | unmatched client)``.
    The state of a trace is cleared (and its timer deleted) once nothing of it waits; a TTL of twice the
    timeout backs that up. Flink counters: ``client_calls_joined``, ``client_calls_unmatched``,
    ``server_halves_dropped`` (called requests no instrumented client reported)."""

    def __init__(self, timeout_ms: int, tolerance_ns: int) -> None:
        self.timeout_ms, self.tolerance_ns = timeout_ms, tolerance_ns

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(_expiring(  # (Pending, timer ms or None)
            ValueStateDescriptor("pending", Types.PICKLED_BYTE_ARRAY()), 2 * self.timeout_ms / 1000))
        group = runtime_context.get_metrics_group()
        self.joined = group.counter("client_calls_joined")
        self.unmatched = group.counter("client_calls_unmatched")
        self.dropped = group.counter("server_halves_dropped")

    def _store(self, pending: Any, timer: int | None, ctx: Any) -> None:
        timers = ctx.timer_service()
        deadline = pending.deadline(self.timeout_ms) if pending else None
        if timer is not None and timer != deadline:
            timers.delete_processing_time_timer(timer)
        if deadline is None:
            self.state.clear()
            return
        if deadline != timer:
            timers.register_processing_time_timer(deadline)
        self.state.update((pending, deadline))

    def _emit(self, outcome: Any):
        self.joined.inc(len(outcome.joined))
        self.unmatched.inc(len(outcome.unmatched_clients))
        self.dropped.inc(outcome.dropped_servers)
        yield from client_join.publish_items(outcome)

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        pending, timer = self.state.value() or (None, None)
        pending, outcome = client_join.add(pending, value[1], ctx.timer_service().current_processing_time())
        self._store(pending, timer, ctx)
        yield from self._emit(outcome)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        pending, _fired = self.state.value() or (None, None)
        pending, outcome = client_join.expire(pending, timestamp, self.timeout_ms, self.tolerance_ns)
        self._store(pending, None, ctx)  # this timer has fired: nothing to delete
        yield from self._emit(outcome)


class CumulateClient(KeyedProcessFunction):
    """Per totals key (joined: region and model; unmatched: model): running totals -> one OTLP batch at most once
    a second (a processing-time timer, as ``CountLate``), stamped when emitted and strictly increasing per key.
    The totals expire after ``ttl_s`` without news (keyed state stays bounded)."""

    def __init__(self, ttl_s: float = 0.0) -> None:
        self.ttl_s = ttl_s

    def open(self, runtime_context: RuntimeContext) -> None:
        self.totals = runtime_context.get_state(
            _expiring(ValueStateDescriptor("client-totals", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        totals = self.totals.value() or client_join.Totals(time.time_ns() // MS * MS)
        self.totals.update(totals.add(value[1]))
        now_ms = ctx.timer_service().current_processing_time()
        ctx.timer_service().register_processing_time_timer((now_ms // 1000 + 1) * 1000)  # same second: one timer

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        totals = self.totals.value()
        if totals is None:
            return
        stamp = max(time.time_ns() // MS * MS, totals.last_ns + MS)
        totals.last_ns = stamp
        self.totals.update(totals)
        yield client_join.encode(ctx.get_current_key(), totals, stamp)
