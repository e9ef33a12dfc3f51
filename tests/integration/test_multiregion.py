"""The multi-region topology (``infersight up --topology multi-region``) end to end, and its first link faults.

One KRaft broker per region (the region's gateway writes there), a link relay per region, the global broker
and one dedicated MirrorMaker 2 copying ``infersight.otlp.*`` to ``<region>.infersight.otlp.*``; normalize
reads the mirrored topics ``read_committed``, and the metrics job runs on the global broker unchanged. The
fleet simulator sends to the three regional gateways and every series (region, model, version, track) in
Prometheus is held to its ledger: a loss and a double count each summed on its own, never netted.

Faults (issue #25 item 4, short versions): a 60 s silent cut of one region's link (the relay blackholes it)
and, meanwhile, a reset of another's (connections closed, refused for 20 s), then both healed; MirrorMaker 2
killed with ``kill -9`` under traffic (the supervisor starts it again; its exactly-once producers are fenced).
"""

from __future__ import annotations

import time
import uuid

import pytest

from infersight.demo import endpoints_of
from infersight.simulator.run import Simulator
from infersight.stack import multiregion
from tests.integration.pipeline_util import Jobs, wait_until
from tests.support.pipeline_load import (
    MirrorResumed,
    Tally,
    counted_per_region,
    fleet,
    keep_event_time_moving,
    settle,
    tally,
)

pytestmark = pytest.mark.integration
RATE = 200  # requests/s over the three regions: four brokers, MM2 and Flink share 2 cores here
CUT_S = 60
RESET_S = 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A multi-region stack of its own (free ports, temp state), with normalize and metrics on the global side."""
    from infersight.stack import setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    setup.ensure_all()
    s = Stack(tmp_path_factory.mktemp("multiregion"), PortPlan.free(topology="multi-region"))
    try:
        s.up()
        yield s
    finally:
        s.down(wipe=True)


@pytest.fixture(scope="module")
def jobs(stack):
    j = Jobs(stack)
    j.start()
    try:
        wait_until(j.running, 180, "normalize and metrics to run")
        yield j
    finally:
        j.stop_quietly()


def per_region(t_sent, t_counted, region: str) -> Tally:
    return tally({k: n for k, n in t_sent.items() if k[0] == region},
                 {k: n for k, n in t_counted.items() if k[0] == region})


def settled(stack, sim, tag: str, quiet_s: float = 40) -> dict[str, Tally]:
    from tests.support.pipeline_load import counted_per_series, sent_per_series

    flusher = keep_event_time_moving(endpoints_of(stack), tag)
    try:
        settle(stack.layout.prometheus_url, {tag: sim.ledger}, timeout_s=180, quiet_s=quiet_s)
    finally:
        flusher.stop()
    sent = sent_per_series(sim.ledger)
    counted = counted_per_series(stack.layout.prometheus_url, tag)
    return {r: per_region(sent, counted, r) for r in stack.layout.regions}


def test_the_topology_runs_and_every_request_is_counted_once_per_region(stack, jobs):
    lay = stack.layout
    rows = {s.name: s for s in stack.status()}
    expected = {"kafka", "mirrormaker", *(f"kafka-{r}" for r in lay.regions), *(f"link-{r}" for r in lay.regions)}
    assert all(rows[n].healthy for n in expected), {n: rows[n] for n in expected}
    tag = uuid.uuid4().hex[:6]
    sim = Simulator(fleet(tag, RATE), endpoints_of(stack), seed=31).start()
    try:
        wait_until(lambda: len(counted_per_region(lay.prometheus_url, tag)) == len(lay.regions), 150,
                   "the first windows of every region in Prometheus")
        time.sleep(10)
    finally:
        delivered = sim.stop()
    assert delivered, sim.exporter.stats()
    tallies = settled(stack, sim, tag)
    for region, t in tallies.items():
        assert t.sent > 0 and (t.lost, t.double) == (0, 0), (region, t.to_json())
    # each gateway wrote to its own region's broker, never to the global one: the global raw topics are empty
    from confluent_kafka import Consumer, TopicPartition

    from infersight.schemas.topics import OTLP_REQUESTS

    consumer = Consumer({"bootstrap.servers": lay.kafka_bootstrap, "group.id": f"probe-{tag}"})
    try:
        ends = [consumer.get_watermark_offsets(TopicPartition(OTLP_REQUESTS.name, p), timeout=10)[1]
                for p in range(OTLP_REQUESTS.partitions)]
    finally:
        consumer.close()
    assert sum(ends) == 0
    # and MM2 wrote nothing into a regional cluster (offset syncs, configs, heartbeats all on the global side)
    from infersight.stack import kafka_admin, mirror

    mirrored = {t.name for t in mirror.mirrored_topics()}
    for region in lay.regions:
        assert kafka_admin.existing_topics(lay.region_bootstrap(region)) - {"__consumer_offsets"} == mirrored
    crossed = {r: multiregion.link(lay, r)["bytes_down"] for r in lay.regions}
    assert all(n > 0 for n in crossed.values()), crossed  # MM2 reached every region through its link only
    print(f"multi-region: {sum(t.sent for t in tallies.values())} requests counted exactly per series; "
          f"link bytes {crossed}")


def test_a_silent_link_cut_and_a_link_reset_lose_and_double_nothing(stack, jobs):
    lay = stack.layout
    cut, reset = lay.regions[0], lay.regions[1]
    tag = uuid.uuid4().hex[:6]
    sim = Simulator(fleet(tag, RATE), endpoints_of(stack), seed=32).start()
    try:
        wait_until(lambda: len(counted_per_region(lay.prometheus_url, tag)) == len(lay.regions), 150,
                   "the first windows of every region in Prometheus")
        assert multiregion.link(lay, cut, "cut")["state"] == "cut"
        assert multiregion.link(lay, reset, "reset")["state"] == "reset"
        cut_at = time.monotonic()
        time.sleep(RESET_S)
        assert multiregion.link(lay, reset, "heal")["state"] == "open"
        frozen = counted_per_region(lay.prometheus_url, tag).get(cut, 0)
        time.sleep(max(0.0, CUT_S - (time.monotonic() - cut_at)))
        # nothing crossed the cut link: its region's count stood still while the others moved on
        assert counted_per_region(lay.prometheus_url, tag).get(cut, 0) == frozen
        assert multiregion.link(lay, cut, "heal")["state"] == "open"
        healed_at = time.monotonic()
        time.sleep(10)
    finally:
        delivered = sim.stop()
    assert delivered, sim.exporter.stats()
    tallies = settled(stack, sim, tag)
    print(f"link faults: cut {cut} {CUT_S} s, reset {reset} {RESET_S} s; settled {time.monotonic() - healed_at:.0f} s "
          f"after the heal: " + "; ".join(f"{r} {t.to_json()}" for r, t in tallies.items()))
    for region, t in tallies.items():
        assert t.sent > 0 and (t.lost, t.double) == (0, 0), (region, t.to_json())


def test_mirrormaker_killed_loses_and_doubles_nothing_and_moves_again(stack, jobs):
    import os
    import signal

    lay = stack.layout
    tag = uuid.uuid4().hex[:6]
    resumed = MirrorResumed(lay.kafka_bootstrap, lay.normalize_sources())
    resumed.start()
    sim = Simulator(fleet(tag, RATE), endpoints_of(stack), seed=33).start()
    try:
        wait_until(lambda: len(counted_per_region(lay.prometheus_url, tag)) == len(lay.regions), 150,
                   "the first windows of every region in Prometheus")
        pid = stack.running_components()[multiregion.MIRRORMAKER]
        killed = time.time()
        resumed.arm(killed)
        os.kill(pid, signal.SIGKILL)
        # the goal (<= 20 s) is bench/multiregion.py's to measure; here: it comes back at all, well within a minute
        wait_until(lambda: resumed.moving_at is not None, 90, "mirrored data created after the kill")
        assert stack.running_components()[multiregion.MIRRORMAKER] != pid
        time.sleep(10)
    finally:
        delivered = sim.stop()
        resumed.stop_event.set()
    assert delivered, sim.exporter.stats()
    tallies = settled(stack, sim, tag)
    print(f"MM2 kill -9: moving again after {resumed.moving_at - killed:.1f} s; "
          + "; ".join(f"{r} {t.to_json()}" for r, t in tallies.items()))
    for region, t in tallies.items():
        assert t.sent > 0 and (t.lost, t.double) == (0, 0), (region, t.to_json())
