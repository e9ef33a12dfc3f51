"""Evaluation and request records into window aggregates, then through the engine."""

from __future__ import annotations

import numpy as np
import pytest

from infersight.flink_jobs.quality.aggregate import add_evaluations, add_requests, window_end_s
from infersight.flink_jobs.quality.core import Engine, EngineParams, Series
from infersight.schemas.quality import PII, RELEVANCE, score_signal
from infersight.schemas.units import NS

T0 = 1_800_000_000 * NS


def _ev(name, score, rate, t_ns=T0, model="m", track="stable"):
    return {"trace_id": "a" * 32, "span_id": "b" * 16, "time_ns": t_ns, "region": "r1", "name": name,
            "sample_rate": rate, "score": score, "label": None, "model": model, "model_version": "v1",
            "track": track}


def test_evaluations_are_weighted_per_window_and_series():
    aggs = {}
    unscored = add_evaluations(aggs, [_ev(RELEVANCE, 1.0, 0.5), _ev(RELEVANCE, 0.0, 1.0), _ev(RELEVANCE, None, 0.1),
                                      _ev(PII, 1.0, 0.1), _ev(RELEVANCE, 0.5, 1.0, t_ns=T0 + 10 * NS)])
    assert unscored == 1
    key = (window_end_s(T0, 10), Series("r1", "m", "v1", "stable"))
    agg = aggs[key]
    assert agg.evaluators[RELEVANCE].score.mean == pytest.approx(2 / 3)  # weights 2 and 1
    assert agg.histograms[score_signal(RELEVANCE)].counts.sum() == pytest.approx(3.0)
    assert agg.histograms[PII].counts[1] == pytest.approx(10.0)  # flagged bin, weight 1 / 0.1
    assert len(aggs) == 2  # the later result is in the next window


def test_requests_fill_the_every_request_signals():
    aggs = {}
    recs = [{"region": "r1", "model": "m", "model_version": "v1", "track": "stable", "end_ns": T0, "tokens_in": 100,
             "tokens_out": 20, "ttft_s": 0.05, "finish_reason": fr, "error_type": err}
            for fr, err in (("stop", None), ("length", None), ("error", "TimeoutError"), ("weird", "Boom"))]
    add_requests(aggs, recs)
    (agg,) = aggs.values()
    h = agg.histograms
    assert h["tokens_in"].n == 4 and h["ttft"].counts.sum() == 4
    assert list(h["finish_reason"].counts) == [1, 1, 0, 0, 1, 1]  # stop, length, ..., error, other
    assert list(h["error_type"].counts) == [2, 1, 0, 0, 0, 1]  # none x2, timeout, other


def test_records_through_the_engine_catch_a_canary_that_answers_worse():
    rng = np.random.default_rng(2)
    engine = Engine(EngineParams(baseline="stable_track"))
    onsets = []
    for w in range(180):
        aggs = {}
        t = T0 + w * 10 * NS
        evs = [_ev(RELEVANCE, float(np.clip(rng.normal(0.8, 0.15), 0, 1)), 0.1, t_ns=t) for _ in range(60)]
        evs += [_ev(RELEVANCE, float(np.clip(rng.normal(0.7, 0.15), 0, 1)), 0.1, t_ns=t, track="canary")
                for _ in range(60)]
        add_evaluations(aggs, evs)
        (end,) = {k[0] for k in aggs}
        out = engine.close_window(end, {s: a for (_, s), a in aggs.items()})
        onsets += [r for r in out if r["type"] == "drift" and r["event"] == "onset"]
    assert [(r["track"], r["signal"]) for r in onsets] == [("canary", score_signal(RELEVANCE))]
