"""Triton's span events and metric families, mapped onto our stages and names (pure functions)."""

from __future__ import annotations

import pytest

from infersight.schemas import attributes as A
from infersight.schemas import metrics as M
from infersight.schemas import triton as T
from infersight.schemas.registry import REGISTRY
from infersight.schemas.spec import Source

# A request as Triton's trace file shows one (ns): 15 us to enqueue, 20 us queued, 266 us computing.
EVENTS = [("REQUEST_START", 1_000_000), ("QUEUE_START", 1_015_000), ("COMPUTE_START", 1_035_000),
          ("COMPUTE_INPUT_END", 1_053_000), ("COMPUTE_OUTPUT_START", 1_261_000), ("COMPUTE_END", 1_301_000),
          ("REQUEST_END", 1_320_000)]


def test_stage_durations_follow_the_documented_intervals():
    timings = T.stage_durations(EVENTS)
    assert timings.problems == ()
    assert timings.durations == pytest.approx({
        "queue": 20e-6, "compute": 266e-6, "compute_input": 18e-6, "compute_infer": 208e-6,
        "compute_output": 40e-6, "request": 320e-6, "overhead": 34e-6})
    attrs = timings.attributes()
    assert attrs[A.QUEUE_DURATION] == pytest.approx(20e-6)  # Triton's queue is our queue stage
    assert attrs[A.E2E] == pytest.approx(320e-6)


def test_order_of_events_does_not_matter_and_unknown_events_are_ignored():
    shuffled = list(reversed(EVENTS)) + [("HTTP_RECV_START", 5), ("CUSTOM", 1)]
    assert T.stage_durations(shuffled).durations == T.stage_durations(EVENTS).durations


@pytest.mark.parametrize("events, problem", [
    ([("QUEUE_START", 100), ("COMPUTE_START", 50)], "queue: COMPUTE_START is 50 ns before QUEUE_START"),
    ([("QUEUE_START", -1), ("COMPUTE_START", 50)], "QUEUE_START: timestamp -1"),
    ([("QUEUE_START", "x")], "QUEUE_START: timestamp 'x'"),
    ([("QUEUE_START", True)], "QUEUE_START: timestamp True"),
    ([("QUEUE_START", 1), ("QUEUE_START", 2), ("COMPUTE_START", 3)], "QUEUE_START repeated"),
    ([None, 5, ("a",)], "not a (name, timestamp_ns) pair"),
])
def test_bad_input_is_reported_not_raised(events, problem):
    timings = T.stage_durations(events)
    assert any(p.startswith(problem) for p in timings.problems), timings.problems
    assert all(v >= 0 for v in timings.durations.values())


def test_repeated_event_keeps_the_first_and_non_iterable_is_reported():
    timings = T.stage_durations([("QUEUE_START", 1), ("QUEUE_START", 2), ("COMPUTE_START", 3)])
    assert timings.durations["queue"] == pytest.approx(2e-9)
    assert T.stage_durations(42).problems and T.stage_durations(42).durations == {}
    assert T.stage_durations([]).durations == {}


def test_overhead_needs_consistent_parts():
    events = [("REQUEST_START", 0), ("REQUEST_END", 10), ("QUEUE_START", 0), ("COMPUTE_START", 8),
              ("COMPUTE_END", 20)]
    timings = T.stage_durations(events)
    assert "overhead" not in timings.durations
    assert "queue + compute exceed the request duration" in timings.problems


def test_triton_metric_families_map_to_ours_with_units():
    assert T.normalise_metric("nv_inference_queue_duration_us", 1_500_000) == (M.QUEUE_TIME_METRIC, 1.5)
    assert T.normalise_metric("nv_inference_request_duration_us", 2_000_000) == (
        M.GEN_AI_SERVER_REQUEST_DURATION, 2.0)
    assert T.normalise_metric("nv_gpu_utilization", 0.75) == (M.HW_GPU_UTILIZATION, 0.75)
    assert T.normalise_metric("nv_inference_pending_request_count", 3) == (M.QUEUE_DEPTH, 3.0)
    first = T.normalise_metric("nv_inference_first_response_histogram_ms", 250)
    assert first[0] != M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN  # first chunk is not first token
    assert first[1] == pytest.approx(0.25)
    for bad in (("nv_unknown", 1), ("nv_gpu_utilization", "x"), ("nv_gpu_utilization", True), (None, 1)):
        assert T.normalise_metric(*bad) is None


def test_entries_are_consistent_with_the_registry():
    names = [e.name for e in T.ENTRIES]
    assert len(names) == len(set(names))
    # Part of the registry (and so of the reference page), each name once.
    assert all(REGISTRY[e.name] is e for e in T.ENTRIES)
    for name in (M.TRITON_QUEUE_DURATION_US, M.TRITON_REQUEST_DURATION_US, M.TRITON_GPU_UTILIZATION):
        assert name in T.TRITON_METRICS and REGISTRY[name].source is Source.TRITON
    events = [e for e in T.ENTRIES if e.name in T.TRITON_EVENTS]
    assert len(events) == 7 and all(e.source is Source.TRITON and not e.emitted for e in events)
    assert all(e.name.startswith("infersight.") for e in T.ENTRIES if e.source is Source.INFERSIGHT)
