"""The quality job's logic without PyFlink: the metrics job's quality signals (``infersight.quality_signals``: per
request series and metrics window, the every-request drift signals as bin counts) and evaluation batches in, per
(region, model) key and window the series' partial ``WindowAggregate``s out (``read_signals``/``read_evaluations``,
with dead letters for what breaks the contract); per key, an ``Engine`` closing those windows in window order, its
quality records and drift events as JSON and its estimates, distances and alarms as OTLP metrics (``QualityState``).
Plain state, pickled by the job into keyed state.

The key is (region, model): one engine sees every version and track of a model in a region, so the stable
track is at hand as a canary's baseline (``core``). A partial is ``{Series: WindowAggregate}`` of one key and
window; partials of the same window merge by addition, whatever the batching.

``read_requests`` makes the same request partials from request records themselves (``infersight.requests``
batches): what the job read before the metrics job published the signals (issue #17), kept as the reference the
signals are tested against (``tests/unit/test_quality_signals.py``) and for reading archived or replayed records."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from infersight.flink_jobs.common.deadletter import dead_letter, json_of
from infersight.flink_jobs.common.keys import join_fields
from infersight.flink_jobs.metrics.otlp_metrics import MetricsBatch
from infersight.flink_jobs.quality.aggregate import add_evaluations, series_aggregates, window_end_s
from infersight.flink_jobs.quality.core import Engine, EngineParams, Series, WindowAggregate
from infersight.flink_jobs.quality.drift import Histogram
from infersight.schemas import pipeline as P
from infersight.schemas.evaluation import validate as evaluation_problems
from infersight.schemas.quality import DRIFT_SIGNAL_BY_NAME, GUARDRAILS
from infersight.schemas.quality_signals import REQUEST_SIGNALS
from infersight.schemas.quality_signals import problems as signal_problems
from infersight.schemas.records import parse_batch, record_problems
from infersight.schemas.topics import EVALUATIONS, QUALITY_SIGNALS, REQUESTS
from infersight.schemas.units import MS, NS

JOB = "infersight-quality"
OUTPUT_KEY_SEP = "|"  # infersight.quality's record key: region|model|version|track
# label -> the record field holding it: what the cardinality bound folds (``common.cardinality``); an
# evaluator name is free text from plug-ins, so it is bounded too
LABELS = {"region": "region", "model": "model", "model_version": "model_version", "track": "track",
          "evaluator": "name"}
_LABEL_FIELDS = ("region", "model", "model_version", "track")

Partial = dict[Series, WindowAggregate]
# (engine key, window end ms) -> (records in it, the partial)
Partials = dict[tuple[str, int], tuple[int, Partial]]
Fold = Callable[[dict[str, Any]], dict[str, Any]]


def engine_key(region: str, model: str) -> str:
    return join_fields((region, model))


def output_key(record: Mapping[str, Any]) -> str:
    """The Kafka key of a quality record or drift event: ``region|model|version|track``."""
    return OUTPUT_KEY_SEP.join(str(record.get(f) or "") for f in Series._fields)


def _batch(value: str | bytes, topic: str, letters: list[str]) -> list[Any]:
    try:
        return parse_batch(value)
    except Exception as exc:  # noqa: BLE001 - orjson's JSONDecodeError, or bytes that are not UTF-8
        letters.append(dead_letter(JOB, f"payload: not a JSON batch ({type(exc).__name__}: {exc})", value,
                                   topic=topic))
        return []


def _labels_problems(item: dict[str, Any]) -> list[str]:
    return [f"{f}: must be a string, got {item.get(f)!r:.60}" for f in _LABEL_FIELDS
            if item.get(f) is not None and not isinstance(item.get(f), str)]


def _letter(item: Any, problems: list[str], topic: str) -> str:
    trace_id = item.get("trace_id") if isinstance(item, dict) else None
    return dead_letter(JOB, "; ".join(problems), json_of(item), problems=problems, topic=topic,
                       trace_id=trace_id if isinstance(trace_id, str) else None)


def _partials(valid: list[dict[str, Any]], time_field: str, window_s: int,
              add: Callable[[dict, list[dict[str, Any]], int], Any]) -> Partials:
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rec in valid:
        key = (engine_key(rec.get("region") or "", rec.get("model") or ""),
               window_end_s(rec[time_field], window_s) * 1000)
        groups.setdefault(key, []).append(rec)
    out: Partials = {}
    for key, recs in groups.items():
        aggs: dict[tuple[int, Series], WindowAggregate] = {}
        add(aggs, recs, window_s)
        out[key] = (len(recs), {s: a for (_end, s), a in aggs.items()})
    return out


def read_requests(value: str | bytes, window_s: int, fold: Fold | None = None,
                  topic: str = REQUESTS.name) -> tuple[Partials, list[str]]:
    """One ``infersight.requests`` message -> its partials (every-request drift signals) and dead letters: one
    for a message that is not a JSON batch, one per record breaking the contract (``record_problems``). The job
    itself reads the metrics job's signals instead (``read_signals``: the same partials, per window)."""
    letters: list[str] = []
    valid = []
    for item in _batch(value, topic, letters):
        problems = record_problems(item)
        if problems:
            letters.append(_letter(item, problems, topic))
            continue
        valid.append(fold(item) if fold is not None else item)
    return _request_partials(valid, window_s), letters


def _request_partials(valid: list[dict[str, Any]], window_s: int) -> Partials:
    """``_partials(valid, "end_ns", window_s, add_requests)`` in one grouping pass: each record keyed once by
    window and series (the engine key and the aggregate's key both follow from it), not once per level."""
    groups: dict[tuple[int, str, str, str, str], list[dict[str, Any]]] = {}
    for rec in valid:
        key = (rec["end_ns"] // NS // window_s, rec.get("region") or "", rec.get("model") or "",
               rec.get("model_version") or "", rec.get("track") or "stable")
        group = groups.get(key)
        if group is None:
            groups[key] = [rec]
        else:
            group.append(rec)
    out: Partials = {}
    aggregates = series_aggregates(list(groups.values()))
    for ((window, region, model, version, track), recs), agg in zip(groups.items(), aggregates, strict=True):
        out_key = (engine_key(region, model), (window + 1) * window_s * 1000)  # aggregate.window_end_s, in ms
        n, partial = out.get(out_key) or (0, {})
        partial[Series(region, model, version, track)] = agg
        out[out_key] = (n + len(recs), partial)
    return out


def read_signals(value: str | bytes, window_s: int, fold: Fold | None = None,
                 topic: str = QUALITY_SIGNALS.name) -> tuple[Partials, list[str]]:
    """One ``infersight.quality_signals`` message (the metrics job's every-request drift signals of one request series
    and metrics window, ``schemas.quality_signals``; an array of such records is read too) -> its partials: the
    signals' histograms under the quality series (the metrics series without its engine), in the quality window
    holding the metrics window, exactly what ``read_requests`` makes of that window's request records. Dead letters:
    a message that is not JSON, a record ``schemas.quality_signals.problems`` rejects, and a metrics window that
    straddles two quality windows (``--window-s`` must hold whole metrics windows: a multiple of the metrics job's
    ``--window-s``)."""
    letters: list[str] = []
    out: Partials = {}
    for item in _batch(value, topic, letters):
        problems = signal_problems(item)
        if not problems:
            end_ms, window_ms = item["window_end_ms"], item["window_ms"]
            end_s = window_end_s((end_ms - window_ms) * MS, window_s)  # the window of its first possible request
            if end_s != window_end_s(end_ms * MS - 1, window_s):  # ... and of its last
                problems = [f"window_ms: the metrics window [{end_ms - window_ms}, {end_ms}) ms straddles two quality "
                            f"windows of {window_s} s (the quality job's --window-s must be a multiple of the metrics "
                            f"job's)"]
        if problems:
            letters.append(_letter(item, problems, topic))
            continue
        rec = fold(item) if fold is not None else item
        series = Series(rec["region"], rec["model"], rec["model_version"], rec["track"])
        agg = WindowAggregate(histograms={name: Histogram(np.asarray(rec["signals"][name]["counts"], dtype=float),
                                                          rec["signals"][name]["n"]) for name in REQUEST_SIGNALS})
        key = (engine_key(series.region, series.model), end_s * 1000)
        n, partial = out.get(key) or (0, {})
        partial[series] = partial[series].merge(agg) if series in partial else agg
        out[key] = (n + rec["requests"], partial)
    return out, letters


def read_evaluations(value: str | bytes, window_s: int, fold: Fold | None = None,
                     topic: str = EVALUATIONS.name) -> tuple[Partials, list[str], int]:
    """One ``infersight.evaluations`` message -> its partials (weighted estimates and the sampled drift signals),
    dead letters (``schemas.evaluation.validate``'s problems, or labels that are not strings) and how many
    valid results had no score (a judge error or an unparsed reply: counted, not estimated)."""
    letters: list[str] = []
    valid = []
    for item in _batch(value, topic, letters):
        problems = evaluation_problems(item) + _labels_problems(item) if isinstance(item, dict) else [
            f"evaluation: not a JSON object, got {type(item).__name__}"]
        if problems:
            letters.append(_letter(item, problems, topic))
            continue
        valid.append(fold(item) if fold is not None else item)
    unscored = sum(1 for rec in valid if rec.get("score") is None)
    return _partials(valid, "time_ns", window_s, add_evaluations), letters, unscored


def merge(a: Partial | None, b: Partial) -> Partial:
    """Two partials of one key and window as one (``a`` may be None)."""
    if not a:
        return dict(b)
    out = dict(a)
    for s, agg in b.items():
        out[s] = out[s].merge(agg) if s in out else agg
    return out


def load_pinned(path: str) -> dict[tuple[str, str, str], Histogram]:
    """``--pinned``: a JSON object ``{"region|model|signal": {"counts": [...], "n": samples}}`` (the signal's bins,
    ``schemas.quality.DRIFT_SIGNALS``) -> the ``pinned`` baseline's reference histograms."""
    import numpy as np

    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    out: dict[tuple[str, str, str], Histogram] = {}
    for key, h in raw.items():
        region, model, signal = key.split(OUTPUT_KEY_SEP, 2)
        bins = DRIFT_SIGNAL_BY_NAME[signal].bins if signal in DRIFT_SIGNAL_BY_NAME else None
        if bins is None or len(h["counts"]) != bins:
            raise ValueError(f"{path}: {key!r} is not a drift signal with {bins or '?'} bins "
                             f"(schemas.quality.DRIFT_SIGNALS)")
        out[(region, model, signal)] = Histogram(np.asarray(h["counts"], dtype=float), int(h["n"]))
    return out


def _finite(x: Any) -> Any:
    """JSON without NaN or infinity (not JSON): such a float becomes null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def event_json(record: dict[str, Any]) -> str:
    return json.dumps(_finite(record), sort_keys=True, separators=(",", ":"), allow_nan=False)


class QualityState:
    """One key's engine and the end (s) of the last window it closed."""

    def __init__(self, state: dict[str, Any] | None = None, params: EngineParams | None = None,
                 pinned: Mapping[tuple[str, str, str], Histogram] | None = None) -> None:
        state = state or {}
        self.engine: Engine = state.get("engine") or Engine(params, pinned)
        if params is not None:  # a restart's options win over the pickled ones (series state is kept)
            self.engine.params = params
        if pinned is not None:
            self.engine.pinned = dict(pinned)
        self.last_end: int | None = state.get("last_end")

    def to_state(self) -> dict[str, Any]:
        return {"engine": self.engine, "last_end": self.last_end}

    def close(self, window_end_s: int, partial: Partial) -> tuple[list[dict[str, Any]], bytes | None]:
        """Close one window (in window order): the quality records and drift events, and their metrics (None when
        there is nothing to show). A window at or before the last one closed is refused (ValueError): the engine
        never looks back."""
        if self.last_end is not None and window_end_s <= self.last_end:
            raise ValueError(f"window ending {window_end_s} is not after the last closed ({self.last_end})")
        self.last_end = window_end_s
        outputs = self.engine.close_window(window_end_s, partial)
        return outputs, self.metrics(outputs)

    def metrics(self, outputs: list[dict[str, Any]]) -> bytes | None:
        """Prometheus' view of one window's outputs (``schemas.pipeline``'s ``QUALITY_*`` and ``DRIFT_*``), each
        point stamped with the window's end: per evaluator the weighted mean with its interval, the pass or
        flag ratio and the samples; the composite; per drift signal measured each distance and the alarm
        (0/1; also for a drift event's series without data in the window)."""
        gauges: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[str, float, int]] = {}

        def gauge(name: str, unit: str, labels: dict[str, str], value: Any, at_ns: int) -> None:
            if value is not None and math.isfinite(value):
                gauges[(name, tuple(sorted(labels.items())))] = (unit, float(value), at_ns)

        for out in outputs:
            series = Series(*(str(out.get(f) or "") for f in Series._fields))
            labels = dict(zip(P.DEPLOYMENT_LABELS, series, strict=True))  # version -> model_version
            at_ns = int(out["window_end"]) * NS
            if out["type"] == "drift":
                if out.get("signal") is None:
                    continue
                gauge(P.DRIFT_ALARM, P.ALARM_UNIT, {**labels, P.LABEL_SIGNAL: out["signal"]},
                      1.0 if out["event"] == "onset" else 0.0, at_ns)
                continue
            for name, ev in out["evaluators"].items():
                el = {**labels, P.LABEL_EVALUATOR: name}
                gauge(P.QUALITY_SCORE, P.SCORE_UNIT, el, ev["mean"], at_ns)
                gauge(P.QUALITY_SCORE_CI_LOW, P.SCORE_UNIT, el, ev["ci_low"], at_ns)
                gauge(P.QUALITY_SCORE_CI_HIGH, P.SCORE_UNIT, el, ev["ci_high"], at_ns)
                if name in GUARDRAILS:
                    gauge(P.QUALITY_FLAG_RATIO, "1", el, ev.get("flag_rate"), at_ns)
                else:
                    gauge(P.QUALITY_PASS_RATIO, "1", el, ev.get("pass_rate"), at_ns)
                gauge(P.QUALITY_SAMPLES, P.SAMPLES_UNIT, el, ev["samples"], at_ns)
            gauge(P.QUALITY_COMPOSITE, P.SCORE_UNIT, labels, out["composite"], at_ns)
            states = self.engine.drift.get(series, {})
            for signal, d in out["drift"].items():
                for distance, value in d["distances"].items():
                    gauge(P.DRIFT_DISTANCE, P.DISTANCE_UNIT,
                          {**labels, P.LABEL_SIGNAL: signal, P.LABEL_DISTANCE: distance}, value, at_ns)
                alarm = states.get(signal)
                key = (P.DRIFT_ALARM, tuple(sorted({**labels, P.LABEL_SIGNAL: signal}.items())))
                if alarm is not None and key not in gauges:
                    gauge(P.DRIFT_ALARM, P.ALARM_UNIT, dict(key[1]), 1.0 if alarm.alarm.open else 0.0, at_ns)
        if not gauges:
            return None
        batch = MetricsBatch(JOB)
        for (name, labels_items), (unit, value, at_ns) in gauges.items():
            batch.gauge(name, unit, dict(labels_items), value, at_ns)
        return batch.serialize()
