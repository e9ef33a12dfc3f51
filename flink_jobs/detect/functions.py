"""PyFlink wiring of the detect job: one key for the whole fleet (the correlator compares regions, so it must
see every series' window), rows waiting in state per window until the watermark passes it; the region status
stream keyed the same way (one key), its latest record per region kept beside them and handed to the engine
before each batch of windows."""

from __future__ import annotations

import json
import pickle
from typing import Any

from pyflink.common import Types
from pyflink.datastream import KeyedCoProcessFunction
from pyflink.datastream.functions import RuntimeContext
from pyflink.datastream.state import MapStateDescriptor, ValueStateDescriptor

from infersight.flink_jobs.detect.core import EngineParams
from infersight.flink_jobs.detect.regions import newer_status
from infersight.flink_jobs.detect.stream import DetectState, parse, parse_status

FLEET = "fleet"


def fleet_key(_value: Any) -> str:
    return FLEET


class DetectWindows(KeyedCoProcessFunction):
    """Window-stats records (input 1) and region status records (input 2) -> ``("event", json)`` per anomaly,
    incident or notice event, ``("metrics", bytes)`` per window, and dead letters on ``dlq_tag``."""

    def __init__(self, dlq_tag: Any, params: EngineParams | None = None) -> None:
        self.dlq_tag, self.params = dlq_tag, params

    def open(self, runtime_context: RuntimeContext) -> None:
        self.pending = runtime_context.get_map_state(
            MapStateDescriptor("pending", Types.LONG(), Types.PICKLED_BYTE_ARRAY()))
        self.state = runtime_context.get_state(ValueStateDescriptor("detect", Types.PICKLED_BYTE_ARRAY()))
        self.statuses = runtime_context.get_map_state(
            MapStateDescriptor("region_status", Types.STRING(), Types.PICKLED_BYTE_ARRAY()))

    def process_element2(self, value: str, ctx: KeyedCoProcessFunction.Context):
        """A status record is only kept here (cheap: no engine state touched); the next windows take it."""
        record, letter = parse_status(value)
        if letter is not None:
            yield self.dlq_tag, letter
            return
        if newer_status(self.statuses.get(record["region"]), record):
            self.statuses.put(record["region"], record)

    def process_element1(self, value: str, ctx: KeyedCoProcessFunction.Context):
        rows, letter = parse(value)
        if letter is not None:
            yield self.dlq_tag, letter
            return
        if not rows:
            return
        end_ms = int(rows[0]["window_end"] * 1000)
        waiting = self.pending.get(end_ms) or []
        waiting.extend(rows)
        self.pending.put(end_ms, waiting)
        ctx.timer_service().register_event_time_timer(end_ms)

    def on_timer(self, timestamp: int, ctx: KeyedCoProcessFunction.OnTimerContext):
        due = sorted(k for k in self.pending.keys() if k <= timestamp)
        rows = [row for k in due for row in self.pending.get(k)]
        if not rows:  # an earlier timer took these windows with its own (the watermark jumped past several)
            return
        for k in due:
            self.pending.remove(k)
        raw = self.state.value()
        state = DetectState(pickle.loads(raw) if raw else None, self.params)
        state.region_statuses(list(self.statuses.values()))
        events, metrics, _bad = state.windows(rows)
        self.state.update(pickle.dumps(state.to_state(), protocol=pickle.HIGHEST_PROTOCOL))
        for event in events:
            yield "event", json.dumps(event, sort_keys=True, separators=(",", ":"))
        if metrics is not None:
            yield "metrics", metrics


def is_event(t: Any) -> bool:
    return t[0] == "event"


def is_metrics(t: Any) -> bool:
    return t[0] == "metrics"


def second(t: Any) -> Any:
    return t[1]
