"""PyFlink wiring of the canary job: batches split into per-bake keys, one keyed bake each with an event-time
timer per look."""

from __future__ import annotations

import pickle
import time
from typing import Any

from pyflink.common import Row, Types
from pyflink.datastream import FlatMapFunction, KeyedProcessFunction
from pyflink.datastream.functions import RuntimeContext
from pyflink.datastream.state import ListStateDescriptor, ValueStateDescriptor

from infersight.flink_jobs.canary.core import NS, BakeConfig
from infersight.flink_jobs.canary.rows import Projector
from infersight.flink_jobs.canary.stream import (
    DEFAULT_LIMITS,
    CanaryState,
    event_json,
    first_canary_ns,
    route,
    route_evaluations,
)
from infersight.flink_jobs.common.cardinality import LabelLimiter

NS_PER_MS = 1_000_000


class Route(FlatMapFunction):
    """A requests batch (an evaluations batch with ``evaluations``) -> ``("records", (key, pickled rows))`` per
    bake key (``rows.Rows``: only what the bake reads), ``("dlq", letter)``."""

    def __init__(self, evaluations: bool = False) -> None:
        self.evaluations = evaluations

    def open(self, runtime_context: RuntimeContext) -> None:
        self.limiter = LabelLimiter(DEFAULT_LIMITS)
        self.projector = Projector()  # the default metric table, as the Judge's BakeConfig (checked there)

    def flat_map(self, value: str):
        keyed, letters = (route_evaluations if self.evaluations else route)(value, self.limiter,
                                                                              int(time.time() * 1000), self.projector)
        for letter in letters:
            yield "dlq", letter
        for key, records in keyed.items():
            yield "records", (key, pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL))


class Judge(KeyedProcessFunction):
    """Keyed by bake key: ``Row(rollout, verdict JSON)`` per look and ``("metrics", bytes)`` beside it.

    Batches wait in a list state until the look's timer, which loads the bake once, adds them and judges:
    the bake's reservoirs (a few MB pickled) are not read and written per batch."""

    def __init__(self, config: BakeConfig) -> None:
        self.config = config

    def open(self, runtime_context: RuntimeContext) -> None:
        self.state = runtime_context.get_state(ValueStateDescriptor("canary", Types.PICKLED_BYTE_ARRAY()))
        self.pending = runtime_context.get_list_state(ListStateDescriptor("pending", Types.PICKLED_BYTE_ARRAY()))
        self.next_look_ms = runtime_context.get_state(ValueStateDescriptor("next_look_ms", Types.LONG()))

    def process_element(self, value: Any, ctx: KeyedProcessFunction.Context):
        _key, payload = value
        if self.next_look_ms.value() is None:  # no bake running: only a canary can start one
            first_ns = first_canary_ns(pickle.loads(payload))
            if first_ns is None:
                return
            first_ms = first_ns // NS_PER_MS + int(self.config.interval_s * 1000)
            self.next_look_ms.update(first_ms)
            ctx.timer_service().register_event_time_timer(first_ms)
        self.pending.add(payload)

    def on_timer(self, timestamp: int, ctx: KeyedProcessFunction.OnTimerContext):
        key = ctx.get_current_key()
        raw = self.state.value()
        state = CanaryState(pickle.loads(raw) if raw else None, self.config)
        for payload in self.pending.get():
            state.feed(key, pickle.loads(payload))
        self.pending.clear()
        event, metrics = state.look(timestamp * NS_PER_MS)
        self.state.update(pickle.dumps(state.to_state(), protocol=pickle.HIGHEST_PROTOCOL))
        next_ns = state.next_look_ns()
        if next_ns is None:
            self.next_look_ms.clear()
        else:
            next_ms = max(next_ns // NS_PER_MS, timestamp + 1)
            self.next_look_ms.update(next_ms)
            ctx.timer_service().register_event_time_timer(next_ms)
        if event is not None:
            yield "verdict", Row(event["rollout"], event_json(event))
            yield "metrics", metrics


def records_key(t: Any) -> str:
    return t[0]


def is_tag(tag: str):
    return lambda t: t[0] == tag


def second(t: Any) -> Any:
    return t[1]


__all__ = ["NS", "Judge", "Route", "is_tag", "records_key", "second"]
