"""Incidents from the fleet engine (flink_jobs/detect/core.py) on labelled simulated faults: scope, absorption,
global push with its likely cause, silence, resolution, no duplicate, and an engine state round trip."""

from __future__ import annotations

import json

import numpy as np

from infersight.flink_jobs.detect.core import Engine
from infersight.flink_jobs.detect.replay import incidents, run
from infersight.simulator.scenarios import REGIONS, Fault, generate, make_scenario, random_fault


def scenario(kind: str, seed: int = 7, **fault):
    sc = make_scenario(seed, hours=2.0)
    rng = np.random.default_rng(seed)
    f = random_fault(kind, sc.t0 + 3600.0, rng)
    for k, v in fault.items():
        setattr(f, k, v)
    sc.faults = [f]
    return sc, f


def found(sc):
    return incidents(run(generate(sc)))


def test_regional_outage_is_one_incident_with_the_survivors_absorbing():
    sc, f = scenario("regional_outage", region=0)
    incs = found(sc)
    assert len(incs) == 1
    inc = incs[0]
    assert inc["kind"] == "outage" and inc["scope_kind"] == "region"
    assert inc["regions"] == ["us-east-1"]
    assert inc["absorbing_regions"] == sorted(REGIONS[1:])
    assert "absorbing its load" in inc["summary"]
    assert f.start <= inc["start"] <= f.start + 20


def test_global_push_is_global_and_names_the_new_track():
    sc, f = scenario("global_push", lags=[0, 2, 3])
    incs = found(sc)
    assert len(incs) == 1
    inc = incs[0]
    assert inc["scope_kind"] == "global" and inc["kind"] == "bad_rollout"
    assert inc["regions"] == sorted(REGIONS)
    assert "push-" in inc["likely_cause"] and "likely cause" in inc["summary"]


def test_one_model_error_burst_is_model_region_scope():
    sc, f = scenario("error_burst", region=1, model=2, magnitude=0.1)
    (inc,) = found(sc)
    assert inc["scope_kind"] == "model_region" and inc["regions"] == ["eu-west-1"] and inc["models"] == ["mistral-7b"]


def test_a_silent_region_is_a_signal():
    sc, f = scenario("silent_region", region=2)
    (inc,) = found(sc)
    assert inc["kind"] == "silent" and inc["scope_kind"] == "region" and inc["regions"] == ["ap-southeast-1"]
    assert inc["start"] - f.start <= 3 * 10


def test_incident_resolves_after_clean_windows_and_is_not_raised_twice():
    sc, f = scenario("error_burst", region=0, model=0, magnitude=0.2)
    events = [e for e in run(generate(sc)) if e["type"] == "incident"]
    assert [e["event"] for e in events][0] == "open"
    assert [e["event"] for e in events].count("open") == 1
    assert events[-1]["event"] == "resolve"
    # resolved once the burst is over plus the clean windows, long before the replay ends
    assert f.end <= events[-1]["end"] <= f.end + 60


def test_clean_diurnal_traffic_raises_nothing():
    assert found(make_scenario(11, hours=6.0)) == []


def test_engine_state_round_trip_gives_identical_events():
    sc, f = scenario("regional_outage", region=1)
    rows = generate(sc)
    whole = list(run(rows))
    cut = len(rows) * 55 // 100  # mid-outage
    e = Engine()
    got = []
    for r in rows[:cut]:
        got += e.observe(*r)
    e2 = Engine.from_state(json.loads(json.dumps(e.to_state())))
    for r in rows[cut:]:
        got += e2.observe(*r)
    got += e2.flush()
    assert got == whole


def test_fault_truths_are_labelled():
    sc, f = scenario("latency_creep")
    (truth,) = sc.truths()
    assert truth["scope_kind"] == "model_region" and truth["detectable_at"] > truth["start"]
    assert isinstance(f, Fault)


def test_series_state_is_bounded_and_idle_series_expire():
    from infersight.flink_jobs.detect.core import EngineParams

    e = Engine(EngineParams(max_series=50, expire_s=600.0))
    for i in range(200):  # 200 distinct series names in one window: 50 kept, the rest counted
        e.observe(10.0, "r", f"model-{i}", "stable", "error_ratio", 0.0)
    assert len(e.series) == 50 and e.counts["series_limit"] == 150
    for w in range(2, 100):  # only one series goes on; the others expire after 600 s
        e.observe(10.0 * w, "r", "model-0", "stable", "error_ratio", 0.0)
    e.flush()
    assert len(e.series) == 1 and e.counts["series_expired"] == 49
    assert len(e.detectors) == 1
