"""The detect job's logic without PyFlink: window-stats records in, engine events and Prometheus metrics out,
window by window, in the order the replay uses (``replay.clean_rows``), so the job and ``infersight detect
replay`` give the same incidents on the same windows; region status records in (``parse_status``), each region's
latest handed to the engine before the windows it closes. Plain state (dicts), kept by the job in keyed state."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from infersight.flink_jobs.common.deadletter import dead_letter
from infersight.flink_jobs.detect.core import Engine, EngineParams
from infersight.flink_jobs.detect.regions import region_of
from infersight.flink_jobs.detect.replay import clean_rows
from infersight.flink_jobs.metrics.otlp_metrics import MetricsBatch
from infersight.schemas import pipeline as P
from infersight.schemas import region_status as RS
from infersight.schemas import window_stats as W
from infersight.schemas.units import NS

JOB = "infersight-detect"


def parse(raw: str) -> tuple[list[dict[str, Any]], str | None]:
    """A window-stats record's replay rows, or ``([], dead letter)`` when it cannot be used."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return [], dead_letter(JOB, "not_json", raw)
    problem = W.record_problem(value)
    if problem is not None:
        return [], dead_letter(JOB, problem, raw)
    return W.rows(value), None


def parse_status(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """A region status record (``infersight.region_status``), or ``(None, dead letter)`` when it cannot be used."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None, dead_letter(JOB, "not_json", raw)
    problem = RS.record_problem(value)
    if problem is not None:
        return None, dead_letter(JOB, f"region_status_{problem}", raw)
    return value, None


class DetectState:
    """The engine plus the cumulative anomaly counters and the incident and notice kinds seen (so a closed one
    reads 0)."""

    def __init__(self, state: dict[str, Any] | None = None, params: EngineParams | None = None) -> None:
        state = state or {}
        self.engine = Engine.from_state(state["engine"], params) if "engine" in state else Engine(params or
                                                                                                    EngineParams())
        self.anomalies: dict[str, float] = dict(state.get("anomalies", {}))  # "region|model|signal" -> count
        self.kinds: list[list[str]] = [list(k) for k in state.get("kinds", [])]  # [scope_kind, kind] seen
        self.notice_kinds: list[list[str]] = [list(k) for k in state.get("notice_kinds", [])]  # [region, kind] seen
        self.start_ns: int | None = state.get("start_ns")

    def to_state(self) -> dict[str, Any]:
        return {"engine": self.engine.to_state(), "anomalies": dict(self.anomalies), "kinds": self.kinds,
                "notice_kinds": self.notice_kinds, "start_ns": self.start_ns}

    def region_statuses(self, records: list[dict[str, Any]]) -> None:
        """Hand the engine each region's latest status (valid records, from ``parse_status``)."""
        for record in records:
            self.engine.region_status(record)

    def windows(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bytes | None, dict[str, int]]:
        """Feed one or more windows' rows (any order): the events, the metrics of the newest window closed (None
        before any closed) and the rows refused, by reason."""
        bad: dict[str, int] = {}
        events: list[dict[str, Any]] = []
        for t, region, model, track, signal, value in clean_rows(rows, bad):
            events += self.engine.observe(t, region, model, track, signal, value)
        return events, self.metrics(events), bad

    def metrics(self, events: list[dict[str, Any]]) -> bytes | None:
        """Prometheus' view as of the newest window fed (``P.ANOMALY_SCORE``, ``P.ANOMALIES``,
        ``P.OPEN_INCIDENTS``, ``P.HELD_SERIES``); None while there is nothing to show."""
        engine = self.engine
        if engine.current_t is None:
            return None
        at_ns = int(engine.current_t * NS)
        if self.start_ns is None:
            self.start_ns = at_ns
        for e in events:
            if e.get("type") == "anomaly":
                key = f"{e['region']}|{e['model']}|{e['signal']}"
                self.anomalies[key] = self.anomalies.get(key, 0) + 1
        open_now: dict[tuple[str, str], int] = {}
        for inc in engine.correlator.incidents:
            kind = (inc["scope_kind"], inc["kind"])
            open_now[kind] = open_now.get(kind, 0) + 1
            if list(kind) not in self.kinds:
                self.kinds.append(list(kind))
        held_now: dict[tuple[str, str], int] = {}
        held_in = Counter(region_of(k) for k in engine.regions.held)
        for region, notice in engine.regions.notices.items():
            key = (region, notice["kind"])
            held_now[key] = held_in[region]
            if list(key) not in self.notice_kinds:
                self.notice_kinds.append(list(key))
        active = [(k, d) for k, d in sorted(engine.detectors.items()) if d.active and d.reported]
        if not (self.anomalies or self.kinds or self.notice_kinds or active):
            return None
        batch = MetricsBatch(JOB)
        for key, n in sorted(self.anomalies.items()):
            region, model, signal = key.split("|", 2)
            batch.counter(P.ANOMALIES, "{anomaly}", {P.LABEL_REGION: region, P.LABEL_MODEL: model,
                                                    P.LABEL_SIGNAL: signal}, n, self.start_ns, at_ns)
        for dkey, d in active:
            region, model, track, signal = dkey.split("|", 3)
            batch.gauge(P.ANOMALY_SCORE, "1", {P.LABEL_REGION: region, P.LABEL_MODEL: model, P.LABEL_TRACK: track,
                                               P.LABEL_SIGNAL: signal}, d.peak, at_ns)
        for scope_kind, kind in self.kinds:  # every kind seen, so a resolved one reads 0, not its last value
            batch.gauge(P.OPEN_INCIDENTS, "{incident}", {P.LABEL_SCOPE_KIND: scope_kind, P.LABEL_KIND: kind},
                        open_now.get((scope_kind, kind), 0), at_ns)
        for region, kind in self.notice_kinds:  # likewise: a region caught up reads 0
            batch.gauge(P.HELD_SERIES, "{series}", {P.LABEL_REGION: region, P.LABEL_KIND: kind},
                        held_now.get((region, kind), 0), at_ns)
        return batch.serialize()
