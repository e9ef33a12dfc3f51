"""The canary job's logic without PyFlink: request batches in, per-key records out (each model's region and
its overall key), one bake per key that starts when the canary appears, a look every interval, verdict events
and Prometheus metrics out. Plain state (dicts), kept by the job in keyed state."""

from __future__ import annotations

import json
from typing import Any

from infersight.flink_jobs.canary.core import ALL_REGIONS, NS, Bake, BakeConfig
from infersight.flink_jobs.common.cardinality import LabelLimiter
from infersight.flink_jobs.common.deadletter import dead_letter, json_of
from infersight.flink_jobs.metrics.otlp_metrics import MetricsBatch
from infersight.schemas import canary as C
from infersight.schemas import pipeline as P
from infersight.schemas.pipeline import OVERFLOW_VALUE
from infersight.schemas.records import parse_batch

JOB = "infersight-canary"
KEY_SEP = "|"
DEFAULT_LIMITS = {"model": 200, "region": 50}  # bakes are per model x (region + overall): bounded keys


def route(raw: str | bytes, limiter: LabelLimiter, now_ms: int) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """One ``infersight.requests`` message -> records by bake key (``model|region`` and ``model|`` for the
    overall bake), and dead letters for what is not a request record. Models and regions past the
    cardinality bounds are folded by the limiter and not judged (a folded model mixes several)."""
    try:
        batch = parse_batch(raw)
    except (ValueError, TypeError):
        return {}, [dead_letter(JOB, "not_json", raw)]
    out: dict[str, list[dict[str, Any]]] = {}
    letters = []
    for item in batch:
        if not isinstance(item, dict) or not isinstance(item.get("model"), str) or not item["model"] \
                or not isinstance(item.get("end_ns"), int) or not isinstance(item.get("region", ""), str):
            letters.append(dead_letter(JOB, "not_a_request_record", json_of(item),
                                       problems=["a request record needs a model, a region and an integer end_ns"]))
            continue
        folded = limiter.fold(item, now_ms)
        if OVERFLOW_VALUE in (folded.get("model"), folded.get("region")):
            continue
        for region in (item.get("region", ""), ALL_REGIONS):
            out.setdefault(f"{item['model']}{KEY_SEP}{region}", []).append(item)
    return out, letters


class CanaryState:
    """One key's bake (or its final verdict, kept so that the same canary does not start a second bake)."""

    def __init__(self, state: dict[str, Any] | None = None, config: BakeConfig | None = None) -> None:
        self.config = config or BakeConfig()
        state = state or {}
        self.bake = Bake.from_state(state["bake"], self.config) if state.get("bake") else None
        self.final: dict[str, Any] | None = state.get("final")

    def to_state(self) -> dict[str, Any]:
        return {"bake": self.bake.to_state() if self.bake else None, "final": self.final}

    def feed(self, key: str, records: list[dict[str, Any]]) -> int | None:
        """Add records; the event time (ns) of the next look when a bake runs, else None."""
        canary = [r for r in records if r.get("track") == "canary"]
        if self.bake is None:
            versions = {str(r.get("model_version") or "") for r in canary}
            if not canary or (self.final is not None and versions <= {self.final["canary_version"]}):
                return None  # no canary yet, or the judged canary still serving after its final verdict
            model, _, region = key.partition(KEY_SEP)
            self.bake = Bake(model, region, min(r["end_ns"] for r in canary), self.config)
        self.bake.add_records(records)
        return self.next_look_ns()

    def next_look_ns(self) -> int | None:
        if self.bake is None:
            return None
        return self.bake.start_ns + int((self.bake.looks + 1) * self.config.interval_s * NS)

    def look(self, now_ns: int) -> tuple[dict[str, Any] | None, bytes | None]:
        """Evaluate at ``now_ns``: the verdict event and the metrics, (None, None) without a bake."""
        if self.bake is None:
            return None, None
        verdict = self.bake.evaluate(now_ns)
        event = {"rollout": C.rollout_id(verdict["model"], verdict["canary_version"], verdict["region"]),
                 **verdict, "region": verdict["region"] or C.ALL_REGIONS_LABEL}
        if verdict["final"]:
            self.final, self.bake = event, None  # the reservoirs go: a final verdict never changes
        return event, verdict_metrics(event)


def verdict_metrics(event: dict[str, Any]) -> bytes:
    labels = {P.LABEL_MODEL: event["model"], C.LABEL_CANARY_VERSION: event["canary_version"],
              P.LABEL_REGION: event["region"]}
    batch = MetricsBatch(JOB)
    at_ns = event["at_ns"]
    batch.gauge(C.VERDICT, C.VERDICT_UNIT, labels, C.VERDICT_CODE[event["verdict"]], at_ns)
    batch.gauge(C.FINAL, C.FINAL_UNIT, labels, 1.0 if event["final"] else 0.0, at_ns)
    for m in event["metrics"]:
        if m["shift"] is not None:
            batch.gauge(C.SHIFT, C.SHIFT_UNIT, {**labels, C.LABEL_METRIC: m["metric"]}, m["shift"], at_ns)
    return batch.serialize()


def event_json(event: dict[str, Any]) -> str:
    return json.dumps(event, sort_keys=True, separators=(",", ":"), allow_nan=False, default=float)
