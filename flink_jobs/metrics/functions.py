"""The metrics job's Flink functions (timestamps, window aggregates, keyed state). They live in their own
module so Flink pickles them by reference: the job module runs as ``__main__`` under ``flink run``."""

from __future__ import annotations

import json
import pickle
import time
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from pyflink.common import Types
from pyflink.common.watermark_strategy import TimestampAssigner
from pyflink.datastream import KeyedProcessFunction, ProcessFunction
from pyflink.datastream.functions import RuntimeContext
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
from infersight.flink_jobs.common.request_signals import signal_rows
from infersight.flink_jobs.common.state_ttl import expiring as _expiring  # the states of series that stopped expire
from infersight.flink_jobs.common.windows import fired
from infersight.flink_jobs.metrics import client_join, core
from infersight.flink_jobs.metrics.window_stats import Cumulative, WindowStats, fact_of, window_of
from infersight.schemas.records import dump_batch, parse_batch
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
    ms, [(facts, signals)])`` per series and window in it (``fact_of``: only what the window needs; ``signals``: the
    group's quality-signals row, ``request_signals.signal_rows``, binned for the whole batch at once, what the
    window adds up for ``infersight.quality_signals``; a one-item list, as a pod group's, for ``WindowGroups``'
    flattening); records whose
    window ended more than ``catchup_ms`` before the watermark go to the late output whole, as ``(series key,
    None, records)`` per series. A group whose window is behind the watermark but within the bound (a delayed
    region's backlog) is a catch-up group: it also carries its records (JSON, cheap to carry) for the late
    output in case ``WindowGroups`` finds its window already fired. One Flink element per group instead of one
    per request is what makes the job fast: PyFlink's cost is per element."""

    def __init__(self, window_ms: int, late_tag: Any, dlq_tag: Any, limits: dict[str, int] | None = None,
                 span_ms: int = DEFAULT_SPAN_MS, topic: str = REQUESTS.name, catchup_ms: int = 0) -> None:
        self.window_ms, self.late_tag, self.dlq_tag = window_ms, late_tag, dlq_tag
        self.limits, self.span_ms, self.topic = limits, span_ms, topic  # topic: the dead letters' source
        self.catchup_ms = catchup_ms

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
        watermark = ctx.timer_service().current_watermark()
        catchup_ms = getattr(self, "catchup_ms", 0)  # 0: a job pickled before catch-up windows
        groups, late = core.group_batch(records, self.window_ms, watermark, rejected,
                                        self.limiter.folder(ctx.timer_service().current_processing_time()),
                                        catchup_ms)
        self.limiter.count()
        letters += core.dead_letters(rejected, self.topic)
        self.records.inc(len(records) - len(rejected))
        if letters:
            self.dead.inc(len(letters))
            for letter in letters:
                yield self.dlq_tag, letter
        for key, group in late.items():
            yield self.late_tag, (key, None, group)
        rows = signal_rows(list(groups.values())).tolist()  # the quality signals: one numpy pass per batch
        for ((key, end_ms), group), row in zip(groups.items(), rows, strict=True):
            payload = [([fact_of(record) for record in group], tuple(row))]
            if catchup_ms and fired(end_ms, watermark):  # a catch-up group: its records ride along for the late path
                yield timed_key(key, end_ms), end_ms, payload, dump_batch(group)
            else:
                yield timed_key(key, end_ms), end_ms, payload


class PreAggregatePods(ProcessFunction):
    """A batch of pod gauge points (one ``infersight.pods`` message) -> one ``(timed_key(deployment, window end),
    window end ms, [PodWindow])`` per deployment (and roll-up: ``core.group_gauges``) and window in it. Points
    whose window has fired are dropped (as a Flink window drops late elements) and counted in the
    ``late_gauges`` metric; with ``catchup_ms``, only those whose window ended more than that before the
    watermark: the others are catch-up groups, as ``PreAggregate``'s. Per batch, not per point: ~1,500 points/s
    at 10,000 requests/s; each group leaves reduced to its pods' last values."""

    def __init__(self, window_ms: int, dlq_tag: Any, limits: dict[str, int] | None = None,
                 span_ms: int = DEFAULT_SPAN_MS, topic: str = PODS.name, catchup_ms: int = 0) -> None:
        self.window_ms, self.dlq_tag, self.limits, self.span_ms = window_ms, dlq_tag, limits, span_ms
        self.topic, self.catchup_ms = topic, catchup_ms

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
                                         self.limiter.folder(ctx.timer_service().current_processing_time()),
                                         getattr(self, "catchup_ms", 0))
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


_FIRED = -1  # WindowGroups' status of a window that has fired (else: None, or a catch-up timer's deadline, ms)


class WindowGroups(KeyedProcessFunction):
    """Per (key, window): the groups (lists) in list state until the watermark passes the window's end,
    then ``(key, window end ns, reduce(every item))`` stamped with the window's last millisecond (as a
    Flink window's result is). For requests the items are (facts, quality-signals row) per group and ``reduce``
    (``window_of_groups``) builds the WindowStats with the rows' sum: keeping facts rather than an incremental
    aggregate, because updating a sketch accumulator in state re-pickles five sketches (~20 KB) per update.

    Catch-up windows (``catchup_quiet_ms`` > 0): a key whose window is already behind the watermark when a group
    arrives (a delayed region's backlog, let through by ``PreAggregate``'s bound) fires on a processing-time
    timer ``catchup_quiet_ms`` after its *last* group (re-armed per group): a backlog drains in event-time
    order, so once a window's groups stop coming it is complete. Such a result carries no event timestamp (see
    ``job``: it is kept out of event-time windows). A fired key remembers it (state expiring after
    ``catchup_ttl_s``) and sends any further group to ``late_tag`` as ``(series key, None, records)`` (requests:
    a catch-up group carries its records), or, without ``late_tag`` (pods), counts it in ``late_groups`` and
    drops it: never a second result for one key and window. A catch-up result leaves on ``catchup_tag`` (same
    shape; counted in ``catchup_windows``): it has no event timestamp of its window (a processing-time
    timer's), so the job keeps it out of event-time windows and stamps it where a timestamp matters. On-time
    keys (ahead of the watermark) take the path they always did, touching no other state until they fire."""

    def __init__(self, reduce: Callable[[Iterable[Any]], Any], catchup_quiet_ms: int = 0, catchup_ttl_s: float = 0.0,
                 late_tag: Any = None, catchup_tag: Any = None) -> None:
        self.reduce = reduce
        self.catchup_quiet_ms, self.catchup_ttl_s, self.late_tag = catchup_quiet_ms, catchup_ttl_s, late_tag
        self.catchup_tag = catchup_tag

    def open(self, runtime_context: RuntimeContext) -> None:
        self.groups = runtime_context.get_list_state(ListStateDescriptor("groups", Types.PICKLED_BYTE_ARRAY()))
        self.catchup = getattr(self, "catchup_quiet_ms", 0) > 0  # off: a job pickled before catch-up windows
        if self.catchup:
            self.status = runtime_context.get_state(_expiring(
                ValueStateDescriptor("window-status", Types.PICKLED_BYTE_ARRAY()), self.catchup_ttl_s))
            group = runtime_context.get_metrics_group()
            self.late_groups, self.catchup_windows = group.counter("late_groups"), group.counter("catchup_windows")

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        timers = ctx.timer_service()
        if not self.catchup or value[1] - 1 > timers.current_watermark():  # on time: an event-time timer
            self.groups.add(value[2])
            timers.register_event_time_timer(value[1] - 1)
            return
        status = self.status.value()
        if status == _FIRED:  # its result is out: these records are late
            self.late_groups.inc()
            if self.late_tag is not None and len(value) > 3:
                yield self.late_tag, (split_timed_key(value[0])[0], None, parse_batch(value[3]))
            return
        if status is not None:
            timers.delete_processing_time_timer(status)
        deadline = timers.current_processing_time() + self.catchup_quiet_ms
        timers.register_processing_time_timer(deadline)
        self.status.update(deadline)
        self.groups.add(value[2])

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        status = None
        if self.catchup:
            status = self.status.value()
            if status is not None and status != timestamp:  # fired already, or a catch-up timer re-armed since
                return
            self.status.update(_FIRED)
        key, end_ms = split_timed_key(ctx.get_current_key())
        result = self.reduce(item for group in (self.groups.get() or ()) for item in group)
        self.groups.clear()
        if status is None:  # an on-time window: its event-time timer stamps it
            yield key, end_ms * MS, result
        else:
            self.catchup_windows.inc()
            yield self.catchup_tag, (key, end_ms * MS, result)


class RollupWindows(KeyedProcessFunction):
    """The roll-up over regions, keyed by ``global_window_key`` (the global series and window end): regional
    results ``(key, end ns, WindowStats)`` merged per window. On time (ahead of the watermark) it fires on an
    event-time timer at the window's last millisecond, as the Flink window it replaces did, with how many
    regions it merged: ``(global key, end ns, merged, regions)``. A regional result behind the watermark (a
    delayed region's catch-up window) never vanishes, as a Flink window's late element would:

    - if the window has fired, it supersedes it: ``(global key, stamp ns, merged, regions, its own stats)``,
      stamped ``n`` ms after the window's end for the ``n``-th supersession (Prometheus never gets two values for
      one series and timestamp; ``CumulateSeries`` adds its own stats to the running totals, as late records,
      and writes the merged per-window gauges at the stamp, no counters);
    - if it never fired (every region of that series delayed), it fires now, as the window's first result.

    The merged window is kept ``catchup_ttl_s`` (processing time) after it fired, so a delayed region's result
    can still merge, compressed (~32 KB pickled with its sketches at 1,000 requests, ~7 KB compressed: every
    global series keeps a bound's worth of windows); with ``catchup_ttl_s`` 0 (no catch-up) it is dropped when
    it fires."""

    def __init__(self, catchup_ttl_s: float = 0.0) -> None:
        self.catchup_ttl_s = catchup_ttl_s

    def open(self, runtime_context: RuntimeContext) -> None:
        # (merged WindowStats, regions merged, results emitted so far); once emitted, the merged window compressed
        self.window = runtime_context.get_state(_expiring(
            ValueStateDescriptor("rollup", Types.PICKLED_BYTE_ARRAY()), self.catchup_ttl_s))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        key, end_ns, stats = value[:3]
        merged, regions, emitted = self.window.value() or (WindowStats(), (), 0)
        if emitted:
            merged = _unpack(merged)
        merged.merge(stats)
        region = region_of(key)
        if region not in regions:
            regions = (*regions, region)
        timers = ctx.timer_service()
        if not emitted and end_ns // MS - 1 > timers.current_watermark():  # on time
            self.window.update((merged, regions, 0))
            timers.register_event_time_timer(end_ns // MS - 1)
            return
        self.window.update((_pack(merged), regions, emitted + 1))
        if emitted:
            yield global_key(key), end_ns + emitted * MS, merged, len(regions), stats
        else:
            yield global_key(key), end_ns, merged, len(regions)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        state = self.window.value()
        if state is None or state[2]:  # expired, or fired already
            return
        merged, regions, _emitted = state
        if self.catchup_ttl_s > 0:
            self.window.update((_pack(merged), regions, 1))
        else:
            self.window.clear()
        key, end_ms = split_timed_key(ctx.get_current_key())
        yield key, end_ms * MS, merged, len(regions)


def _pack(stats: WindowStats) -> bytes:
    return zlib.compress(pickle.dumps(stats, protocol=pickle.HIGHEST_PROTOCOL), 1)  # ~0.15 ms, once per window


def _unpack(packed: bytes) -> WindowStats:
    return pickle.loads(zlib.decompress(packed))


class CumulateSeries(KeyedProcessFunction):
    """Per series: running totals across windows -> one OTLP batch per window. Late records (``end_ns``
    None) join the running totals without a batch of their own: counters and cumulative histograms count
    every request, only the per-window gauges and quantiles miss the late ones. The series' next window
    shows them; when none comes within ``flush_windows`` windows (processing time: the series stopped), a
    batch of the totals alone does, stamped 1 ms after the series' last batch (Prometheus takes a series'
    samples only in time order, and the next window, if one comes after all, ends later still).

    A window whose end is not after the series' last stamp (a catch-up window behind a newer one: after a heal,
    the region's new windows fire at the watermark, its backlog's when the backlog is quiet) joins the totals
    as late records do (counters at an older time would step back) and writes its per-window gauges and
    quantiles alone at its own time (out of order, floats only). A catch-up window after the series' last stamp
    is written as a window, at its own (past) time. Roll-up windows (``RollupWindows``) carry how many regions
    they merged (``P.ROLLUP_REGIONS``); a superseding one (five fields) adds its late region's stats to the
    totals and writes the merged window's gauges alone at its own stamp."""

    def __init__(self, window_ns: int, flush_windows: int = 2, ttl_s: float = 0.0) -> None:
        self.window_ns, self.ttl_s = window_ns, ttl_s
        self.flush_ms = flush_windows * window_ns // MS

    def open(self, runtime_context: RuntimeContext) -> None:
        self.totals = runtime_context.get_state(
            _expiring(ValueStateDescriptor("totals", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))
        # (stamp of the series' last batch or None, late records not shown yet)
        self.shown = runtime_context.get_state(
            _expiring(ValueStateDescriptor("shown", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))

    def _join_totals(self, stats: WindowStats, first_end_ns: int, ctx: Any) -> None:
        """Late data into the running totals, shown with the series' next window or a flush."""
        totals = self.totals.value() or Cumulative(first_end_ns // self.window_ns * self.window_ns)
        self.totals.update(totals.add_window(stats))
        last_ns, pending = self.shown.value() or (None, False)
        if not pending:  # one flush timer however many late batches come
            timers = ctx.timer_service()
            timers.register_processing_time_timer(timers.current_processing_time() + self.flush_ms)
            self.shown.update((last_ns, True))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        key, end_ns, stats = value[:3]
        if end_ns is None:  # a late record: into the running totals, shown with the series' next window
            self._join_totals(stats, value[3], ctx)
            return
        if len(value) > 4:  # a roll-up window superseded: the late region's part to the totals, the gauges now
            self._join_totals(value[4], end_ns - self.window_ns, ctx)
            yield core.encode_window_gauges(key, end_ns, stats, value[3])
            return
        shown = self.shown.value()
        if shown is not None and shown[0] is not None and end_ns <= shown[0]:  # behind the series' last point
            # a catch-up window that came after the region's newer on-time ones (they fire at the watermark, it
            # when its backlog is quiet): its counts join the totals, its gauges go at its own (past) time: a
            # window fires once, so that point is its only one (Prometheus takes out-of-order floats)
            self._join_totals(stats, end_ns - self.window_ns, ctx)
            if end_ns < shown[0]:
                yield core.encode_window_gauges(key, end_ns, stats, value[3] if len(value) > 3 else None)
            return
        totals = self.totals.value() or Cumulative(end_ns - self.window_ns)
        totals.add_window(stats)
        self.totals.update(totals)
        self.shown.update((end_ns, False))
        yield core.encode_window(key, end_ns, stats, totals, value[3] if len(value) > 3 else None)

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
    cost. A catch-up window (``(key, end ns, pods, True)``: ``catchup``) has no event timestamp in its window,
    so its cost stays out of the unit-cost window (``WindowGroups`` counts such windows); one whose end is not
    after the deployment's last point only adds its cost to the totals (shown with the next window), as
    ``CumulateSeries`` does: a point at an older time would step the counters back."""

    def __init__(self, window_ns: int, pricing: core.Pricing, ttl_s: float = 0.0) -> None:
        self.window_ns, self.pricing, self.ttl_s = window_ns, pricing, ttl_s

    def open(self, runtime_context: RuntimeContext) -> None:
        self.totals = runtime_context.get_state(
            _expiring(ValueStateDescriptor("cost", Types.PICKLED_BYTE_ARRAY()), self.ttl_s))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        key, end_ns, pods = value[:3]
        totals = self.totals.value() or {"gpu_seconds": 0.0, "cost_usd": 0.0, "idle_usd": 0.0,
                                         "start_ns": end_ns - self.window_ns}
        gpu_s, cost, idle = pods.cost(self.window_ns / NS, self.pricing)
        totals["gpu_seconds"] += gpu_s
        totals["cost_usd"] += cost
        totals["idle_usd"] += idle
        in_order = end_ns > totals.get("last_ns", end_ns - 1)
        if in_order:
            totals["last_ns"] = end_ns
        self.totals.update(totals)
        if in_order:
            yield "metrics", key, core.encode_pods(key, end_ns, pods, totals, totals["start_ns"])
        if len(value) == 3:  # not a catch-up window: its cost joins the unit-cost window
            yield "cost", key, cost, end_ns


class UnitCostWindows(KeyedProcessFunction):
    """Per deployment (or roll-up) and window, keyed by ``unit_cost_key``: its cost (``("cost", key, $, end ns)``
    from ``CumulatePods``) and output tokens (``("tokens", key, n, end ns)``, ``output_tokens``) joined into $ per
    1M output tokens, one result per window, stamped with the window's end.

    Hand-written, not a Flink window: cost and tokens come from two sources, and while one is idle (a quiet spell
    of requests beside pods that report every scrape) the other alone moves the watermark on, so a window fired
    with one half and dropped the other, arriving after, as late (no unit cost at all). Here a window answers at
    the watermark if both halves came; if not, it waits: a half arriving behind the watermark arms a
    processing-time timer ``settle_ms`` after it (re-armed per half, so the rest of its burst joins it, as
    ``WindowGroups``' catch-up windows do), and the window answers then if both halves are in. A window that
    answered remembers it: a half after that is counted (``late_unit_cost_tokens``: tokens; cost is in the pods'
    own counters), never a second value for one timestamp. State expires ``wait_s`` after its last write: the
    longest a half waits for the other (a window without requests never answers: no figure, not $0)."""

    def __init__(self, settle_ms: int, wait_s: float) -> None:
        self.settle_ms, self.wait_s = settle_ms, wait_s

    def open(self, runtime_context: RuntimeContext) -> None:
        # (cost $, output tokens, status: None unanswered, no settle timer | a settle timer's deadline | _FIRED)
        self.window = runtime_context.get_state(_expiring(
            ValueStateDescriptor("unit-cost", Types.PICKLED_BYTE_ARRAY()), self.wait_s))
        self.late_tokens = runtime_context.get_metrics_group().counter("late_unit_cost_tokens")

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        cost, tokens, status = self.window.value() or (0.0, 0.0, None)
        if status == _FIRED:
            if value[0] == "tokens":
                self.late_tokens.inc(int(value[2]))
            return
        if value[0] == "cost":
            cost += value[2]
        else:
            tokens += value[2]
        timers = ctx.timer_service()
        if value[3] // MS - 1 > timers.current_watermark():  # on time: the window's event-time timer
            timers.register_event_time_timer(value[3] // MS - 1)
        else:  # behind the watermark: answer once its burst is in
            if status is not None and status > 0:
                timers.delete_processing_time_timer(status)
            status = timers.current_processing_time() + self.settle_ms
            timers.register_processing_time_timer(status)
        self.window.update((cost, tokens, status))

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        state = self.window.value()
        if state is None:  # expired
            return
        cost, tokens, status = state
        if status == _FIRED or (status is not None and status > 0 and status != timestamp):
            return  # answered, or a settle timer armed since is due later
        key, end_ms = split_timed_key(ctx.get_current_key())
        encoded = core.encode_unit_cost(key, end_ms * MS, cost, int(tokens))
        self.window.update((cost, tokens, _FIRED if encoded is not None else None))
        if encoded is not None:
            yield encoded


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
    """A regional window's output tokens -> ``("tokens", key, n, end ns)`` for its deployment and the roll-ups
    (what the pods' cost of each key is divided by)."""
    tokens = float(t[2].tokens["output"])
    for key in deployment_rollups(deployment_of_series(t[0])):
        yield "tokens", key, tokens, t[1]


class CountLateTokens(ProcessFunction):
    """Catch-up regional windows -> nothing, their output tokens counted (``late_unit_cost_tokens``): the
    unit-cost window (event time) cannot place a result without its window's timestamp, so unit cost leaves
    a delayed region's tokens out, counted rather than silently dropped. Its output (none) joins a sink only so
    the operator is part of the job."""

    def open(self, runtime_context: RuntimeContext) -> None:
        self.tokens = runtime_context.get_metrics_group().counter("late_unit_cost_tokens")

    def process_element(self, value: Any, ctx: ProcessFunction.Context):
        self.tokens.inc(int(value[2].tokens["output"]))
        yield from ()


class WindowEndStamp(TimestampAssigner):
    """A window result's event timestamp: its window's last millisecond, what an on-time result carries from its
    event-time timer; for catch-up results on their way to a Kafka topic whose readers take the record timestamp
    as event time (window stats: the detect job's watermarks)."""

    def extract_timestamp(self, value: Any, record_timestamp: int) -> int:
        return value[1] // MS - 1


def global_window_key(t: Any) -> str:
    """A regional window result's roll-up key: the global series and the window's end (``RollupWindows``)."""
    return timed_key(global_key(t[0]), t[1] // MS)


def catchup_marked(t: Any) -> Any:
    """A catch-up pod window ``(key, end ns, pods)`` -> ``(key, end ns, pods, True)`` for ``CumulatePods``."""
    return (*t, True)


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


def unit_cost_key(t: Any) -> str:
    """A cost or tokens half's ``UnitCostWindows`` key: its deployment (or roll-up) and window end."""
    return timed_key(t[1], t[3] // MS)


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


class QualitySignalRecords:
    """Regional request windows (``(key, end ns, WindowStats)``) -> their quality-signals JSON record for the quality
    job (``quality_signals``); a picklable callable for ``flat_map``."""

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms

    def __call__(self, t: Any):
        from infersight.flink_jobs.metrics.quality_signals import signals_record

        out = signals_record(t[0], t[1], t[2], self.window_ms)
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
