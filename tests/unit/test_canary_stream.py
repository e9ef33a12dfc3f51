"""The canary job's logic without PyFlink (flink_jobs/canary/stream.py): batches split per bake key with dead
letters for what is not a request record, a bake that starts with the canary, looks that end in one final
verdict event keyed by rollout, the verdict metrics, and the cardinality bound on models."""

from __future__ import annotations

import json
import pickle

import numpy as np
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.flink_jobs.canary.core import NS, BakeConfig
from infersight.flink_jobs.canary.stream import JOB, CanaryState, event_json, route
from infersight.flink_jobs.common.cardinality import LabelLimiter
from infersight.schemas import canary as C

CONFIG = BakeConfig(bake_s=120.0, interval_s=30.0)


def rec(track, end_s, ttft, model="m", region="us", version=None):
    return {"model": model, "region": region, "track": track, "model_version": version or
            ("v2" if track == "canary" else "v1"), "end_ns": int(end_s * NS), "ttft_s": ttft, "e2e_s": ttft * 5,
            "error_type": None, "tokens_out": 10}


def test_route_keys_each_record_by_region_and_overall_and_dead_letters_the_rest():
    limiter = LabelLimiter({"model": 10, "region": 10})
    batch = [rec("stable", 1, 0.1), rec("canary", 1, 0.1, region="eu"), {"model": 3}, "x"]
    keyed, letters = route(json.dumps(batch), limiter, 0)
    assert {k: len(v) for k, v in keyed.items()} == {"m|us": 1, "m|eu": 1, "m|": 2}
    assert len(letters) == 2 and all(json.loads(x)["job"] == JOB for x in letters)
    assert json.loads(letters[0])["reason"] == "not_a_request_record"
    keyed, letters = route(b"{not json", limiter, 0)
    assert keyed == {} and json.loads(letters[0])["reason"] == "not_json"


def test_route_bounds_models():
    limiter = LabelLimiter({"model": 2, "region": 10})
    batch = [rec("canary", 1, 0.1, model=f"m{i}") for i in range(5)]
    keyed, _ = route(json.dumps(batch), limiter, 0)
    assert {k.split("|")[0] for k in keyed} == {"m0", "m1"}  # the rest folded, not judged


def test_bake_starts_with_the_canary_and_ends_in_one_final_event():
    rng = np.random.default_rng(1)
    state = CanaryState(None, CONFIG)
    assert state.feed("m|us", [rec("stable", 1, 0.1)]) is None  # no canary: no bake, no state
    events = []
    for k in range(6):
        t0 = 10 + k * 30
        records = [rec("canary", t0 + i * 0.1, float(x)) for i, x in enumerate(rng.lognormal(-2.0, 0.5, 300))]
        records += [rec("stable", t0 + i * 0.03, float(x)) for i, x in enumerate(rng.lognormal(-2.3, 0.5, 900))]
        next_ns = state.feed("m|us", records)
        while next_ns is not None and next_ns <= (t0 + 30) * NS:
            event, metrics = state.look(next_ns)
            events.append(event)
            next_ns = state.next_look_ns()
            request = ExportMetricsServiceRequest.FromString(metrics)
            names = {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
            assert {C.VERDICT, C.FINAL} <= names
    assert events[-1]["verdict"] == "fail" and events[-1]["final"]
    assert events[-1]["rollout"] == "m/v2/us" and events[-1]["region"] == "us"
    assert sum(e["final"] for e in events) == 1
    assert json.loads(event_json(events[-1]))["verdict"] == "fail"
    # after the final verdict the same canary starts no second bake; a new canary version does
    assert state.bake is None and state.feed("m|us", [rec("canary", 500, 0.1)]) is None
    assert state.feed("m|us", [rec("canary", 510, 0.1, version="v3")]) is not None


def test_overall_key_reports_region_all():
    state = CanaryState(None, CONFIG)
    state.feed("m|", [rec("canary", 1, 0.1), rec("stable", 1, 0.1)])
    event, _ = state.look(int(31 * NS))
    assert event["region"] == C.ALL_REGIONS_LABEL and event["rollout"] == "m/v2/all"
    assert event["verdict"] == "inconclusive"  # too early, too little data


def test_state_round_trip():
    state = CanaryState(None, CONFIG)
    state.feed("m|us", [rec("canary", 1, 0.1), rec("stable", 1, 0.1)])
    again = CanaryState(pickle.loads(pickle.dumps(state.to_state())), CONFIG)
    assert again.next_look_ns() == state.next_look_ns()


def judged(track, end_s, name, score, rate=0.1, model="m", region="us"):
    """An evaluation record as normalize writes it to infersight.evaluations."""
    return {"trace_id": "ab" * 16, "span_id": "cd" * 8, "time_ns": int(end_s * NS), "region": region, "name": name,
            "sample_rate": rate, "score": score, "label": None, "model": model,
            "model_version": "v2" if track == "canary" else "v1", "track": track}


def test_evaluations_route_into_the_same_bakes_as_judged_items_only():
    from infersight.flink_jobs.canary.stream import route_evaluations
    from infersight.schemas.quality import FAITHFULNESS, PII, RELEVANCE

    limiter = LabelLimiter({"model": 10, "region": 10})
    batch = [judged("canary", 1, RELEVANCE, 0.7), judged("stable", 1, PII, 1.0, region="eu"),
             judged("stable", 1, FAITHFULNESS, 0.9),  # another evaluator: not compared, not a dead letter
             judged("canary", 1, RELEVANCE, None),  # the judge gave nothing usable
             {**judged("canary", 1, RELEVANCE, 0.5), "sample_rate": 0}, "x"]
    keyed, letters = route_evaluations(json.dumps(batch), limiter, 0)
    assert {k: len(v) for k, v in keyed.items()} == {"m|us": 1, "m|eu": 1, "m|": 2}
    us, eu = keyed["m|us"], keyed["m|eu"]  # one row each: what the bake reads (rows.Rows)
    assert us.values[us.metrics.index("quality_score")] == 0.7 and list(us.weights) == [10.0, 10.0]
    assert eu.values[eu.metrics.index("guardrail_flag_ratio")] == 1.0 and list(us.judged) == [True]
    assert len(letters) == 3 and all(json.loads(x)["reason"] == "not_an_evaluation_record" for x in letters)
    assert json.loads(route_evaluations(b"{nope", limiter, 0)[1][0])["reason"] == "not_json"


def test_judged_results_feed_only_the_quality_metrics_and_never_start_a_bake():
    from infersight.flink_jobs.canary.stream import route_evaluations
    from infersight.schemas.quality import REFUSAL, RELEVANCE

    rng = np.random.default_rng(3)
    limiter = LabelLimiter({"model": 10, "region": 10})
    state = CanaryState(None, CONFIG)
    only_judged, _ = route_evaluations(json.dumps([judged("canary", 5, RELEVANCE, 0.5)]), limiter, 0)
    assert state.feed("m|us", only_judged["m|us"]) is None and state.bake is None  # a result is not traffic
    event = None
    for k in range(4):
        t0 = 10 + k * 30
        records = [rec("canary", t0 + i * 0.1, float(x)) for i, x in enumerate(rng.lognormal(-2.3, 0.5, 300))]
        records += [rec("stable", t0 + i * 0.03, float(x)) for i, x in enumerate(rng.lognormal(-2.3, 0.5, 900))]
        # same latency, but the canary's answers are worse (0.60 vs 0.80) and refused more often
        scores = [judged("canary", t0 + i * 0.5, RELEVANCE, float(x)) for i, x in enumerate(rng.beta(6, 4, 60))]
        scores += [judged("stable", t0 + i * 0.2, RELEVANCE, float(x)) for i, x in enumerate(rng.beta(8, 2, 150))]
        scores += [judged("stable", t0 + i * 0.2, REFUSAL, 0.0) for i in range(150)]
        items, _ = route_evaluations(json.dumps(scores), limiter, 0)
        state.feed("m|us", records)
        next_ns = state.feed("m|us", items["m|us"])
        while next_ns is not None and next_ns <= (t0 + 30) * NS:
            event, _ = state.look(next_ns)
            next_ns = state.next_look_ns()
    assert event is not None
    by_metric = {m["metric"]: m for m in event["metrics"]}
    quality = by_metric["quality_score"]
    assert event["verdict"] == "fail" and quality["status"] == "fail" and by_metric["ttft_s"]["status"] != "fail"
    rounds = by_metric["error_ratio"]["n_canary"] / 300  # the results did not count as requests
    assert rounds >= 1 and quality["n_canary"] == rounds * 60  # effective size of equal weights: the count
    assert by_metric["guardrail_flag_ratio"]["n_stable"] == rounds * 150
