"""The canary job's logic without PyFlink: request batches in, per-key records out (each model's region and
its overall key), one bake per key that starts when the canary appears, a look every interval, verdict events
and Prometheus metrics out. Evaluation batches (``infersight.evaluations``: judge and guardrail results of a
sampled share) join the same keys as judged items carrying the quality metrics' fields. Plain state (dicts),
kept by the job in keyed state."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from infersight.flink_jobs.canary.core import ALL_REGIONS, JUDGED, NS, Bake, BakeConfig, projector
from infersight.flink_jobs.canary.rows import INT64_MAX, INT64_MIN, BatchColumns, Projector, Rows, rows_of
from infersight.flink_jobs.common.cardinality import LabelLimiter
from infersight.flink_jobs.common.deadletter import dead_letter, json_of
from infersight.flink_jobs.metrics.otlp_metrics import MetricsBatch
from infersight.schemas import canary as C
from infersight.schemas import pipeline as P
from infersight.schemas.pipeline import OVERFLOW_VALUE
from infersight.schemas.quality import GUARDRAILS, RELEVANCE
from infersight.schemas.records import parse_batch

JOB = "infersight-canary"
KEY_SEP = "|"
DEFAULT_LIMITS = {"model": 200, "region": 50}  # bakes are per model x (region + overall): bounded keys


def route(raw: str | bytes, limiter: LabelLimiter, now_ms: int,
          projector: Projector | None = None) -> tuple[dict[str, Rows], list[str]]:
    """One ``infersight.requests`` message -> what the bakes read of its records (``rows.Rows``) by bake key
    (``model|region`` and ``model|`` for the overall bake), and dead letters for what is not a request record.
    Models and regions past the cardinality bounds are folded by the limiter and not judged (a folded model
    mixes several)."""
    return _route(raw, limiter, now_ms, _request_item, projector or Projector())


def _route(raw: str | bytes, limiter: LabelLimiter, now_ms: int,
           item_of: Callable[[Any], tuple[dict[str, Any] | None, str | None]], projector: Projector
           ) -> tuple[dict[str, Rows], list[str]]:
    """A message's items by bake key (``item_of``: the item to judge or a dead letter, or neither), or the whole
    message dead-lettered when it is not a JSON batch. Each item is projected once (``Projector.row``) and
    the row shared by its region's key and its model's overall key: only that crosses to the bakes."""
    try:
        batch = parse_batch(raw)
    except (ValueError, TypeError):
        return {}, [dead_letter(JOB, "not_json", raw)]
    items: list[dict[str, Any]] = []
    by_key: dict[str, list[int]] = {}  # bake key -> its items' indices, in batch order
    # (model, region) -> its two keys' index lists, None when folded: asked once per pair and batch (the
    # limiter's answer and its last-seen times cannot change within a batch, which has one now_ms)
    keys_of: dict[tuple[str, str], tuple[list[int], list[int]] | None] = {}
    letters = []
    for raw_item in batch:
        item, letter = item_of(raw_item)
        if letter is not None:
            letters.append(letter)
        elif item is not None:
            pair = (item["model"], item.get("region"))  # a missing region is not "" to the limiter
            if pair not in keys_of:
                keys_of[pair] = _key_lists(item, limiter, now_ms, by_key)
            lists = keys_of[pair]
            if lists is not None:
                lists[0].append(len(items))
                lists[1].append(len(items))
                items.append(item)
    return _keyed_rows(items, by_key, projector), letters


def _key_lists(item: dict[str, Any], limiter: LabelLimiter, now_ms: int, by_key: dict[str, list[int]]
               ) -> tuple[list[int], list[int]] | None:
    """The index lists of the item's region key and overall key, None when its model or region is folded by the
    cardinality bound."""
    folded = limiter.fold(item, now_ms)
    if OVERFLOW_VALUE in (folded.get("model"), folded.get("region")):
        return None
    model, region = item["model"], item.get("region", "")
    return (by_key.setdefault(f"{model}{KEY_SEP}{region}", []),
            by_key.setdefault(f"{model}{KEY_SEP}{ALL_REGIONS}", []))


def _keyed_rows(items: list[dict[str, Any]], by_key: dict[str, list[int]], projector: Projector
                ) -> dict[str, Rows]:
    """Each key's rows: the batch projected at once where it can be (``BatchColumns``), else record by record;
    either way each item once, its row shared by its keys. Keys left with no row (the shadow track) are not
    sent."""
    out: dict[str, Rows] = {}
    columns = BatchColumns.of(items, projector.metrics)
    if columns is not None:
        for key, indices in by_key.items():
            rows = columns.rows(projector.names, indices)
            if rows is not None:
                out[key] = rows
        return out
    projected = [projector.row(item) for item in items]
    for key, indices in by_key.items():
        for i in indices:
            row = projected[i]
            if row is not None:
                rows = out.get(key)
                if rows is None:
                    rows = out[key] = Rows(projector.names)
                rows.append(row)
    return out


def _request_item(item: Any) -> tuple[dict[str, Any] | None, str | None]:
    if not isinstance(item, dict) or not isinstance(item.get("model"), str) or not item["model"] \
            or not isinstance(item.get("end_ns"), int) or not INT64_MIN <= item["end_ns"] <= INT64_MAX \
            or not isinstance(item.get("region", ""), str):
        return None, dead_letter(JOB, "not_a_request_record", json_of(item),
                                 problems=["a request record needs a model, a region and an integer end_ns "
                                           "(64-bit)"])
    return item, None


# what an evaluation record becomes for the bake (metrics.DEFAULT_METRICS reads these fields; ``JUDGED`` marks
# it: a judged result is not a request, so it neither starts a bake nor counts as traffic or for the other metrics)
QUALITY_SCORE, QUALITY_RATE, GUARDRAIL_FLAGGED = "quality_score", "quality_sample_rate", "guardrail_flagged"
QUALITY_EVALUATOR = RELEVANCE  # the score compared canary vs stable (every model is judged on it)


def judged_item(evaluation: dict[str, Any]) -> dict[str, Any] | None:
    """An evaluation record as the bake's judged item: the relevance score or a guardrail flag, with its sample
    rate (the weight is its inverse) and the request's series; None for other evaluators and unusable ones."""
    name, score, rate = evaluation.get("name"), evaluation.get("score"), evaluation.get("sample_rate")
    if not isinstance(score, int | float) or isinstance(score, bool) or not isinstance(rate, int | float) \
            or not 0 < rate <= 1:
        return None
    item = {JUDGED: True, "end_ns": evaluation.get("time_ns"), "model": evaluation.get("model"),
            "model_version": evaluation.get("model_version", ""), "track": evaluation.get("track", ""),
            "region": evaluation.get("region", ""), QUALITY_RATE: float(rate)}
    if name == QUALITY_EVALUATOR:
        return {**item, QUALITY_SCORE: float(score)}
    if name in GUARDRAILS:
        return {**item, GUARDRAIL_FLAGGED: score >= 0.5}
    return None


def route_evaluations(raw: str | bytes, limiter: LabelLimiter, now_ms: int, projector: Projector | None = None
                      ) -> tuple[dict[str, Rows], list[str]]:
    """One ``infersight.evaluations`` message -> judged items' rows by bake key, as ``route`` does for
    requests."""
    return _route(raw, limiter, now_ms, _evaluation_item, projector or Projector())


def _evaluation_item(evaluation: Any) -> tuple[dict[str, Any] | None, str | None]:
    item = judged_item(evaluation) if isinstance(evaluation, dict) else None
    if item is None or not isinstance(item["model"], str) or not item["model"] \
            or not isinstance(item["end_ns"], int) or not INT64_MIN <= item["end_ns"] <= INT64_MAX \
            or not isinstance(item["region"], str):
        if not isinstance(evaluation, dict) or evaluation.get("name") in (QUALITY_EVALUATOR, *GUARDRAILS):
            return None, dead_letter(JOB, "not_an_evaluation_record", json_of(evaluation), problems=[
                "an evaluation record needs a model, a region, an integer time_ns, a numeric score and a "
                "sample rate in (0, 1]"])
        return None, None  # another evaluator's result: not judged here
    return item, None


def first_canary_ns(payload: Rows | list[dict[str, Any]]) -> int | None:
    """The end time of a payload's first canary request: what starts a bake (a payload pickled by a job that ran
    before the projection is a list of records)."""
    return (payload if isinstance(payload, Rows) else rows_of(payload)).first_canary_ns()


class CanaryState:
    """One key's bake (or its final verdict, kept so that the same canary does not start a second bake)."""

    def __init__(self, state: dict[str, Any] | None = None, config: BakeConfig | None = None) -> None:
        self.config = config or BakeConfig()
        state = state or {}
        self.bake = Bake.from_state(state["bake"], self.config) if state.get("bake") else None
        self.final: dict[str, Any] | None = state.get("final")

    def to_state(self) -> dict[str, Any]:
        return {"bake": self.bake.to_state() if self.bake else None, "final": self.final}

    def feed(self, key: str, records: Rows | list[dict[str, Any]]) -> int | None:
        """Add a batch's rows of this key (``route``'s; request records are projected first, as are payloads
        of a job that ran before the projection); the event time (ns) of the next look when a bake runs,
        else None."""
        rows = records if isinstance(records, Rows) else rows_of(records, projector(self.config.metrics))
        if self.bake is None:
            first_ns = rows.first_canary_ns()
            if first_ns is None or (self.final is not None
                                    and rows.canary_versions() <= {self.final["canary_version"]}):
                return None  # no canary yet, or the judged canary still serving after its final verdict
            model, _, region = key.partition(KEY_SEP)
            self.bake = Bake(model, region, first_ns, self.config)
        self.bake.add_rows(rows)
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
