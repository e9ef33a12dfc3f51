"""Fault tolerance under load: while the fleet simulator sends, Kafka restarts, a regional gateway
restarts, and the Flink jobs are cancelled and restored from their last checkpoint. Afterwards every
request the simulator counted in its ledger is in Prometheus exactly once (counters per region and
model, and the global roll-up), and the live view shows current numbers again without a restart."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from infersight.demo import endpoints_of
from infersight.schemas.topics import LATE
from infersight.simulator import view
from infersight.simulator.fleet import DEFAULT_MODELS, FleetSpec
from infersight.simulator.prom import window_counts
from infersight.simulator.run import Simulator
from tests.integration.pipeline_util import Jobs, prom, prom_value, request_records, wait_until

pytestmark = pytest.mark.integration
RATE = 500  # requests/s: well inside what the jobs hold on two cores beside the stack and the simulator
WINDOW_MS = 10_000


def fleet(tag: str, rate: float, models=DEFAULT_MODELS) -> FleetSpec:
    return FleetSpec(rate_rps=rate, models=tuple(dataclasses.replace(m, name=f"{m.name}-{tag}") for m in models),
                     diurnal_amplitude=0.0)


def new_checkpoints(jobs: Jobs, n: int = 1) -> None:
    wait_until(jobs.running, 180, "the jobs to run again")
    before = jobs.checkpoints()
    wait_until(lambda: all(c >= before[m] + n for m, c in jobs.checkpoints().items()), 120, "new checkpoints")


@pytest.fixture
def jobs(stack):
    j = Jobs(stack)
    j.start()
    wait_until(j.running, 120, "the jobs to run")
    yield j
    j.stop_quietly()


def test_totals_equal_the_simulator_ledger_through_kafka_gateway_and_job_restarts(stack, jobs):
    lay = stack.layout
    tag = uuid.uuid4().hex[:6]
    models = f'model=~".*-{tag}"'
    sim = Simulator(fleet(tag, RATE), endpoints_of(stack), seed=7).start()
    started = time.monotonic()
    flusher = None
    try:
        wait_until(lambda: prom_value(lay.prometheus_url, f"sum(infersight_requests_total{{{models}}})"), 150,
                   "the first windows in Prometheus")

        stack.stop("kafka")
        time.sleep(5)
        stack.up(only=["kafka"])
        new_checkpoints(jobs)

        gateway = f"gateway-{lay.regions[1]}"
        stack.stop(gateway)
        time.sleep(3)
        stack.up(only=[gateway])
        new_checkpoints(jobs)

        jobs.cancel()
        jobs.start(restore=True)
        new_checkpoints(jobs)

        # the live view recovers by itself: current rates for the fleet's models, fresh windows
        def view_recovered() -> bool:
            snap = view.snapshot(lay.prometheus_url)
            ours = [r for (region, model), r in snap.rows.items() if model.endswith(tag) and region != "global"]
            fresh = [snap.regions.get(region, {}).get("freshness_s", 1e9) for region in lay.regions]
            return len(ours) == 9 and all(r.get("rps", 0) > 0 for r in ours) and max(fresh) < 60
        wait_until(view_recovered, 180, "the live view to show the fleet again")
        # at least a minute of traffic in the ledger, however fast the restarts went on this host
        time.sleep(max(0.0, 70 - (time.monotonic() - started)))
    finally:
        delivered = sim.stop()
    assert delivered, sim.exporter.stats()
    ledger = sim.ledger
    assert ledger.total > RATE * 60

    expected: dict[tuple[str, str], int] = {}
    for (region, model, _version, _track), n in ledger.requests.items():
        expected[(region, model)] = expected.get((region, model), 0) + n

    def per_series(over: str = "") -> dict[tuple[str, str], int]:
        """Counters per region and model now, or (``over="30m"``) their newest value, stale ones too."""
        selector = f'infersight_requests_total{{{models},region!="global"}}'
        query = f"max_over_time({selector}[{over}])" if over else selector
        return {(s["metric"]["region"], s["metric"]["model"]): int(float(s["value"][1]))
                for s in prom(lay.prometheus_url, f"sum by (region, model) ({query})")}

    # a throwaway model keeps event time moving so the fleet's last windows close
    flusher = Simulator(fleet(f"flush{tag}", 30, DEFAULT_MODELS[:1]), endpoints_of(stack), seed=8).start()
    try:
        total = f'sum(infersight_requests_total{{{models},region!="global"}})'
        wait_until(lambda: prom_value(lay.prometheus_url, total) == ledger.total, 300,
                   f"{ledger.total} requests in Prometheus (last: counted - sent per region and model)",
                   last_of=lambda: {k: v - expected.get(k, 0) for k, v in per_series("30m").items()})
        glob = f'sum(infersight_requests_total{{{models},region="global"}})'
        wait_until(lambda: prom_value(lay.prometheus_url, glob) == ledger.total, 60, "the global roll-up",
                   last_of=lambda: prom_value(lay.prometheus_url, glob))
    finally:
        flusher.stop()

    assert per_series() == expected
    errors = prom_value(lay.prometheus_url, f'sum(infersight_request_errors_total{{{models},region!="global"}})')
    assert errors == sum(ledger.errors.values())

    # nothing counted twice: each window holds at most what was sent in it, and windows + late = sent
    windows = window_counts(lay.prometheus_url, 1800, tuple(f"{m.name}-{tag}" for m in DEFAULT_MODELS))
    sent_per_window: dict[int, int] = {}
    for second, n in ledger.by_second.items():
        end = (second * 1000 // WINDOW_MS + 1) * WINDOW_MS
        sent_per_window[end] = sent_per_window.get(end, 0) + n
    assert all(n <= sent_per_window.get(end, 0) for end, n in windows.items()), "a window counted more than sent"
    late = {r["trace_id"] for r in request_records(lay.kafka_bootstrap, LATE.name) if r["model"].endswith(tag)}
    # A window that fired before the failure can fire again after the restore with the records read after
    # the checkpoint; Prometheus keeps one sample per timestamp, so per-window gauges may show less than
    # the counters (which carry every request). Never more.
    in_windows = sum(windows.values())
    assert in_windows + len(late) <= ledger.total
    assert in_windows + len(late) >= 0.9 * ledger.total
    print(f"fault tolerance: {ledger.total} requests counted exactly; {len(late)} arrived late (in the counters); "
          f"per-window gauges short by {ledger.total - in_windows - len(late)} (windows fired twice); "
          f"{sum(s.retries for s in sim.exporter.stats().values())} export retries")
