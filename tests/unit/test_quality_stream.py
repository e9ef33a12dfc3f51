"""The quality job's pure parts (``flink_jobs/quality/stream.py``): batches read into per-key, per-window partials
with dead letters, whatever the batching; windows closed in order into records and Prometheus metrics; the
engine's pickled state round trip and its size per series."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import orjson
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.flink_jobs.common.cardinality import LabelLimiter
from infersight.flink_jobs.quality.core import Engine, EngineParams, Series
from infersight.flink_jobs.quality.drift import DAY_S, DriftParams
from infersight.flink_jobs.quality.stream import (
    JOB,
    LABELS,
    QualityState,
    engine_key,
    event_json,
    merge,
    output_key,
    read_evaluations,
    read_requests,
)
from infersight.schemas import pipeline as P
from infersight.schemas.pipeline import OVERFLOW_VALUE
from infersight.schemas.quality import DRIFT_SIGNALS, GUARDRAILS, PII, RELEVANCE, SCORED_EVALUATORS, score_signal
from infersight.schemas.units import NS
from tests.support.sample_requests import sample_records

T0 = 1_800_000_000  # s, a multiple of 60
W = 60


def _ev(name, score, rate, t_s=T0 + 5, model="m", track="stable", version="v1", **extra):
    return {"trace_id": "a" * 32, "span_id": "b" * 16, "time_ns": int(t_s * NS), "region": "r1", "name": name,
            "sample_rate": rate, "score": score, "label": None, "model": model, "model_version": version,
            "track": track, **extra}


def _dump(items) -> str:
    return orjson.dumps(items).decode()


def _points(metrics: bytes) -> dict[tuple[str, frozenset], tuple[float, int]]:
    req = ExportMetricsServiceRequest.FromString(metrics)
    out = {}
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.gauge.data_points:
                    labels = frozenset((a.key, a.value.string_value) for a in p.attributes)
                    out[(m.name, labels)] = (p.as_double, p.time_unix_nano)
    return out


def test_evaluations_become_weighted_partials_per_key_and_window_and_bad_ones_dead_letters():
    good = [_ev(RELEVANCE, 0.9, 1.0), _ev(RELEVANCE, 0.2, 0.1), _ev(RELEVANCE, None, 0.5),
            _ev(PII, 1.0, 0.25, t_s=T0 + W + 1), _ev(RELEVANCE, 0.5, 1.0, model="other")]
    bad = [_ev(RELEVANCE, 0.5, 0.0), _ev(RELEVANCE, 1.5, 1.0), _ev(RELEVANCE, 0.5, 1.0, model=7), "text"]
    partials, letters, unscored = read_evaluations(_dump(good + bad), W)
    assert unscored == 1
    assert set(partials) == {(engine_key("r1", "m"), (T0 + W) * 1000), (engine_key("r1", "m"), (T0 + 2 * W) * 1000),
                             (engine_key("r1", "other"), (T0 + W) * 1000)}
    n, partial = partials[(engine_key("r1", "m"), (T0 + W) * 1000)]
    assert n == 3  # the unscored result counts as read, not in the estimate
    relevance = partial[Series("r1", "m", "v1", "stable")].evaluators[RELEVANCE].score
    assert relevance.mean == pytest.approx((0.9 + 0.2 * 10) / 11)  # weights 1 / sample rate
    reasons = [json.loads(x)["reason"] for x in letters]
    assert len(reasons) == 4 and all(json.loads(x)["job"] == JOB for x in letters)
    assert "sample_rate" in reasons[0] and "score" in reasons[1] and "model" in reasons[2]
    assert "not a JSON object" in reasons[3]
    _, letters, _ = read_evaluations(b"{not json", W)
    assert [json.loads(x)["reason"] for x in letters][0].startswith("payload: not a JSON batch")


def test_requests_become_partials_of_the_every_request_signals_and_bad_records_dead_letters():
    records = [r.to_dict() for r in sample_records(300, T0 * NS, 100.0, seed=5, regions=("r1",), models=("m",))]
    partials, letters = read_requests(_dump([*records, {"region": "r1"}]), W)
    assert len(letters) == 1 and "model" in json.loads(letters[0])["reason"]
    assert sum(n for n, _ in partials.values()) == 300
    assert {end for _, end in partials} == {(T0 + W) * 1000, (T0 + 2 * W) * 1000}
    for (_, _end), (n, partial) in partials.items():
        assert sum(a.histograms["tokens_out"].n for a in partial.values()) == n
        assert {s.track for s in partial} <= {"stable", "canary"}


def test_partials_merge_to_the_same_window_whatever_the_batching():
    evs = [_ev(RELEVANCE, float(x), r) for x, r in zip(np.linspace(0, 1, 40), [0.1, 0.5, 1.0, 0.25] * 10,
                                                        strict=True)]
    (whole,) = read_evaluations(_dump(evs), W)[0].values()
    merged = None
    for i in range(0, 40, 7):
        (part,) = read_evaluations(_dump(evs[i:i + 7]), W)[0].values()
        merged = merge(merged, part[1])
    s = Series("r1", "m", "v1", "stable")
    a, b = whole[1][s], merged[s]
    assert a.evaluators[RELEVANCE].score.mean == pytest.approx(b.evaluators[RELEVANCE].score.mean)
    assert np.allclose(a.histograms[score_signal(RELEVANCE)].counts, b.histograms[score_signal(RELEVANCE)].counts)


def test_labels_past_their_bound_fold_into_other():
    limiter = LabelLimiter({"region": 10, "model": 2, "model_version": 10, "track": 10, "evaluator": 10},
                           fields=LABELS)
    evs = [_ev(RELEVANCE, 0.5, 1.0, model=m) for m in ("a", "b", "c", "d")]
    partials, letters, _ = read_evaluations(_dump(evs), W, lambda r: limiter.fold(r, 0))
    assert not letters
    assert {k for k, _ in partials} == {engine_key("r1", m) for m in ("a", "b", OVERFLOW_VALUE)}
    assert limiter.folded["model"] == 2


def test_a_window_closes_into_a_record_with_the_weighted_mean_and_its_metrics():
    evs = [_ev(RELEVANCE, y, p) for y, p in ((0.9, 1.0), (0.2, 0.1), (0.6, 0.5), (0.7, 0.25))]
    evs += [_ev(PII, f, 0.5) for f in (1.0, 0.0, 0.0)]
    ((_, partial),) = read_evaluations(_dump(evs), W)[0].values()
    state = QualityState(params=EngineParams())
    outputs, metrics = state.close(T0 + W, partial)
    (rec,) = outputs
    expected = sum(y / p for y, p in ((0.9, 1.0), (0.2, 0.1), (0.6, 0.5), (0.7, 0.25))) / (1 + 10 + 2 + 4)
    relevance = rec["evaluators"][RELEVANCE]
    assert relevance["mean"] == pytest.approx(expected) and relevance["weighted_requests"] == pytest.approx(17)
    assert relevance["ci_low"] < expected < relevance["ci_high"]
    assert output_key(rec) == "r1|m|v1|stable"
    assert json.loads(event_json(rec))["evaluators"][PII]["flag_rate"] == pytest.approx(1 / 3)
    points = _points(metrics)
    labels = {P.LABEL_REGION: "r1", P.LABEL_MODEL: "m", P.LABEL_MODEL_VERSION: "v1", P.LABEL_TRACK: "stable"}

    def value(name, **more):
        return points[(name, frozenset({**labels, **more}.items()))]

    assert value(P.QUALITY_SCORE, evaluator=RELEVANCE) == (pytest.approx(expected), (T0 + W) * NS)
    assert value(P.QUALITY_SCORE_CI_LOW, evaluator=RELEVANCE)[0] == pytest.approx(relevance["ci_low"])
    assert value(P.QUALITY_SCORE_CI_HIGH, evaluator=RELEVANCE)[0] == pytest.approx(relevance["ci_high"])
    assert value(P.QUALITY_PASS_RATIO, evaluator=RELEVANCE)[0] == pytest.approx(relevance["pass_rate"])
    assert value(P.QUALITY_FLAG_RATIO, evaluator=PII)[0] == pytest.approx(1 / 3)
    assert value(P.QUALITY_SAMPLES, evaluator=RELEVANCE)[0] == 4
    assert value(P.QUALITY_COMPOSITE)[0] == pytest.approx(rec["composite"])
    assert (P.QUALITY_PASS_RATIO, frozenset({**labels, "evaluator": PII}.items())) not in points
    with pytest.raises(ValueError, match="not after the last closed"):
        state.close(T0 + W, partial)  # never out of order


def _window(rng, w: int, canary_mean: float, n: int = 160):
    t = T0 + w * W + 1
    evs = [_ev(RELEVANCE, float(np.clip(rng.normal(0.8, 0.1), 0, 1)), 0.1, t_s=t) for _ in range(n)]
    evs += [_ev(RELEVANCE, float(np.clip(rng.normal(canary_mean, 0.1), 0, 1)), 0.1, t_s=t, track="canary",
                version="v2") for _ in range(n)]
    ((_, partial),) = read_evaluations(_dump(evs), W)[0].values()
    return T0 + (w + 1) * W, partial


def test_a_canary_drift_opens_an_alarm_with_its_event_and_gauges():
    rng = np.random.default_rng(4)
    state = QualityState(params=EngineParams(baseline="stable_track"))
    onset = None
    for w in range(40):
        end, partial = _window(rng, w, 0.65)
        outputs, metrics = state.close(end, partial)
        events = [o for o in outputs if o["type"] == "drift" and o["event"] == "onset"]
        if events:
            onset = (events[0], _points(metrics))
            break
    assert onset is not None
    event, points = onset
    assert event["track"] == "canary" and event["signal"] == score_signal(RELEVANCE)
    labels = {P.LABEL_REGION: "r1", P.LABEL_MODEL: "m", P.LABEL_MODEL_VERSION: "v2", P.LABEL_TRACK: "canary",
              P.LABEL_SIGNAL: score_signal(RELEVANCE)}
    assert points[(P.DRIFT_ALARM, frozenset(labels.items()))][0] == 1.0
    shift = points[(P.DRIFT_DISTANCE, frozenset({**labels, P.LABEL_DISTANCE: "wasserstein"}.items()))][0]
    assert shift == pytest.approx(0.15, abs=0.03)
    assert all(math.isfinite(v) for v, _ in points.values())


def test_a_pickled_state_goes_on_exactly_as_the_live_one():
    rng = np.random.default_rng(9)
    windows = [_window(rng, w, 0.7 if w > 10 else 0.8) for w in range(30)]
    live = QualityState(params=EngineParams(baseline="stable_track"))
    restored_state = None
    got_live, got_restored = [], []
    for i, (end, partial) in enumerate(windows):
        got_live.append(event_json({"o": live.close(end, partial)[0]}))
        restored = QualityState(pickle.loads(restored_state) if restored_state else None,
                                EngineParams(baseline="stable_track"))
        got_restored.append(event_json({"o": restored.close(end, partial)[0]}))
        restored_state = pickle.dumps(restored.to_state(), protocol=pickle.HIGHEST_PROTOCOL)
        if i == 0:
            assert restored.to_state()["last_end"] == end
    assert got_live == got_restored
    assert any('"drift"' in g for g in got_live)


def _full_day_engine(day_bucket_s: int, hours: float = 26.0) -> tuple[Engine, Series]:
    """One series with every drift signal fed every window of ``hours`` (60 s windows)."""
    rng = np.random.default_rng(1)
    engine = Engine(EngineParams(drift=DriftParams(day_bucket_s=day_bucket_s)))
    records = [r.to_dict() for r in sample_records(40, 0, 60.0, seed=2, regions=("r1",), models=("m",))]
    names = [*SCORED_EVALUATORS, *GUARDRAILS]
    for w in range(int(hours * 3600 / W)):
        start = T0 + w * W
        reqs = [{**r, "end_ns": r["end_ns"] + start * NS, "start_ns": r["start_ns"] + start * NS, "track": "stable"}
                for r in records]
        partials, _ = read_requests(_dump(reqs), W)
        evs = [_ev(n, float(rng.random()), 0.1, t_s=start + 1) for n in names]
        for key, (_, p) in read_evaluations(_dump(evs), W)[0].items():
            partials[key] = (0, merge(partials.get(key, (0, None))[1], p))
        ((_, partial),) = partials.values()
        engine.close_window(start + W, partial)
    return engine, Series("r1", "m", "v1", "stable")


def test_the_state_per_series_is_bounded_over_a_day():
    """A series with every signal fed every 60 s window for 26 hours (a day of previous-day buckets and more):
    the pickled engine per series stays under 200 KB with the job's 15-minute buckets (measured ~170 KB;
    ~410 KB with the engine's own 5-minute ones) and no longer grows."""
    engine, series = _full_day_engine(900)
    size = len(pickle.dumps(engine, protocol=pickle.HIGHEST_PROTOCOL))
    assert size < 200_000, size
    states = engine.drift[series]
    assert {s.name for s in DRIFT_SIGNALS} == set(states)
    kept = DAY_S + 2 * DriftParams().day_half_width_s
    assert all(len(sd.day_buckets) <= kept // 900 + 2 for sd in states.values())
    longer, _ = _full_day_engine(900, hours=28.0)
    assert len(pickle.dumps(longer, protocol=pickle.HIGHEST_PROTOCOL)) < size * 1.02  # bounded: no growth
