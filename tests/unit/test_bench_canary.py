"""The canary benchmark's blame scenarios (bench/canary.py) on the simulator's traffic, one seeded bake each: a
canary that regresses in one region fails there and not in the healthy region; a slowdown both tracks share is
not blamed on the canary. And the example scenario files users pass to ``--scenario`` load as fleets."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.canary import SHARED_SLOWDOWN, run_bake, run_regional_bake
from infersight.simulator.fleet import FleetSpec

SCENARIOS = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def test_a_regression_in_one_region_fails_that_region_only():
    bake = run_regional_bake(80_001)
    assert bake["regressed"] == "fail" and bake["regressed_fail_s"] is not None
    assert bake["healthy"] != "fail"


def test_a_slowdown_shared_by_both_tracks_is_not_blamed_on_the_canary():
    bake = run_bake(90_001, SHARED_SLOWDOWN, 0.0)
    assert bake["verdict"] != "fail", bake["reasons"]
    assert bake["ttft_p99_ratio"] == pytest.approx(1.0, abs=0.25)  # both sides saw the same slowdown


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.json")), ids=lambda p: p.stem)
def test_example_scenarios_load_as_fleets(path):
    spec = FleetSpec.from_json(path)
    assert spec.canary_share == 0.1
    canary_ones = [p for p in spec.perturbations if p.track == "canary"]
    if path.stem.startswith("canary-") and path.stem != "canary-aa":
        assert canary_ones, "a canary scenario perturbs the canary track"
    if path.stem == "shared-slowdown":
        assert spec.perturbations and not canary_ones
