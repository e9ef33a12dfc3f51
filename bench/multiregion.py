"""Freshness and cost of mirroring (issue #25 item 5, first figures): the same fixed rate through both
topologies, then a 60 s silent cut of one region's link.

    .venv/bin/python -m bench.multiregion                      # 1,000 requests/s, 120 s per topology
    .venv/bin/python -m bench.multiregion --rate 500 --step-s 60

For each topology (``single``: one Kafka; ``multi_region``: a broker per region, link relays, MirrorMaker 2
into the global broker) it starts its own stack (free ports, a temporary folder), deploys every job, sends
the fleet simulator's traffic at ``--rate`` for ``--step-s`` and reports metrics freshness p50/p99 (request
end -> its window queryable in Prometheus, the throughput bench's definition and code) and the ledger
(sent = counted per series; lost and double each summed on its own). On the multi-region stack also:

- mirror lag p50/p99: a record's CreateTime (set by the gateway's producer, kept by MM2) -> the moment a
  ``read_committed`` consumer on the global broker receives it, over every mirrored request record;
- link bytes per request: bytes the three relays forwarded both ways during the step (as sent on the wire:
  the gateways' zstd batches and MM2's fetch requests) / requests sent;
- MirrorMaker 2's CPU (cores, over the step) and peak RSS;
- ``link_cut_60s``: the first region's relay blackholed 60 s under traffic, then healed; sent/lost/double for
  that region, ``drain_s`` (from the heal until its count in Prometheus equals its ledger) and
  ``late_records``: how many of the region's records the metrics job took as late meanwhile (issue #25
  item 3: they join the counters but miss their windows); and from the region status service (sampled twice a
  second): ``status_detected_s`` (the cut -> the region's first ``link_delayed``), ``wrong_status`` (seconds
  from the cut to the drain in a status that contradicts a cut: ``gateways_down`` or ``no_traffic``) and
  ``status_ok_after_heal_s`` (the heal -> ``ok`` again).
- ``mm2_kill9``: MirrorMaker 2 killed with ``kill -9`` under traffic (the supervisor starts it again): every
  region's sent/lost/double, ``moving_s`` (kill -> the first mirrored record created after the kill reaches
  the global broker's ``read_committed`` readers) and ``drain_s`` (kill -> the mirror lag back under 2 s);
  ``status_detected_s`` (the kill -> the first region ``link_delayed``, absent if MM2 moved again before the
  status's lag bound) and ``wrong_status`` (seconds of any region in ``gateways_down`` or ``no_traffic`` until
  the drain).

Writes bench/results/multiregion.json (keys of the issue; what was not measured is absent, never invented).
Timings on the shared 2-core machine are noisy: one run is one sample.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.results_file import save_results
from bench.throughput import judge, run_step
from tests.support.pipeline_load import (
    MirrorResumed,
    WindowWatcher,
    counted_per_series,
    fleet,
    keep_event_time_moving,
    sent_per_series,
    settle,
    tally,
)
from tests.support.region_status import StatusWatch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "multiregion.json"
WINDOW_MS = 10_000


class MirrorLag(threading.Thread):
    """CreateTime -> received, for every record of the mirrored request topics on the global broker."""

    def __init__(self, bootstrap: str, topics: list[str]) -> None:
        super().__init__(daemon=True, name="mirror-lag")
        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-lag-{uuid.uuid4().hex[:6]}",
                                  "auto.offset.reset": "latest", "isolation.level": "read_committed",
                                  "enable.auto.commit": False})
        self.consumer.subscribe(topics)
        self.lags: list[float] = []
        self.recording = threading.Event()
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            for m in self.consumer.consume(500, timeout=0.5):
                if m.error() is None and self.recording.is_set():
                    self.lags.append(time.time() - m.timestamp()[1] / 1000)
        self.consumer.close()

    def quantiles(self) -> tuple[float | None, float | None]:
        if not self.lags:
            return None, None
        p50, p99 = np.quantile(np.array(self.lags), [0.5, 0.99])
        return round(float(p50), 3), round(float(p99), 3)


def link_bytes(stack) -> int:
    from infersight.stack.multiregion import link

    return sum(link(stack.layout, r)["bytes_up"] + link(stack.layout, r)["bytes_down"] for r in stack.layout.regions)


def start(topology: str):
    from infersight.demo import endpoints_of
    from infersight.simulator.run import Simulator
    from infersight.stack import jobs
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    state = Path(tempfile.mkdtemp(prefix=f"infersight-{topology}-"))
    stack = Stack(state, PortPlan.free(topology=topology), log=lambda _: None)
    stack.up()
    jobs.deploy(stack.layout, state / "archive", log=lambda m: print(m, flush=True))
    warm = Simulator(fleet("warm" + uuid.uuid4().hex[:4], 100), endpoints_of(stack), seed=1).start()
    time.sleep(30)  # the jobs warm and windows flow before the measured step
    warm.stop()
    return stack


def measure(stack, rate: float, step_s: float) -> dict[str, Any]:
    """One step at ``rate``: freshness, the ledger and (multi-region) the cost of mirroring."""
    from infersight.demo import endpoints_of

    lay = stack.layout
    watcher = WindowWatcher(lay.prometheus_url)
    watcher.start()
    lag = MirrorLag(lay.kafka_bootstrap, lay.normalize_sources()) if lay.multi_region else None
    if lag is not None:
        lag.start()
        time.sleep(5)  # assigned before the step's first record
        lag.recording.set()
    bytes_before = link_bytes(stack) if lay.multi_region else 0
    step = run_step(stack, watcher, rate, step_s, stack.running_components())
    out: dict[str, Any] = {}
    if lag is not None:
        crossed = link_bytes(stack) - bytes_before
        lag.stop_event.set()
        p50, p99 = lag.quantiles()
        out.update(mirror_lag_p50_s=p50, mirror_lag_p99_s=p99, mirror_lag_records=len(lag.lags),
                   link_bytes_per_request=round(crossed / max(1, step["ledger"].total), 1),
                   mm2_cpu_cores=step["cpu_cores"].get("mirrormaker"),
                   mm2_rss_mb=step["peak_rss_mib"].get("mirrormaker"))
    keep = keep_event_time_moving(endpoints_of(stack), step["tag"])
    settle(lay.prometheus_url, {step["tag"]: step["ledger"]}, timeout_s=max(120.0, step_s))
    last_window = (step["ledger"].last_end_ns // 1_000_000 // WINDOW_MS + 1) * WINDOW_MS
    wait_seen = time.monotonic() + 30
    while last_window not in watcher.first_seen(step["tag"]) and time.monotonic() < wait_seen:
        time.sleep(1)
    keep.stop()
    watcher.stop_event.set()
    row = judge(lay.prometheus_url, watcher, step, max_freshness_s=20.0)
    out.update(freshness_p50_s=row["freshness_p50_s"], freshness_p99_s=row["freshness_p99_s"],
               sent=row["sent"], lost=row["lost_requests"], double=row["double_counted_requests"],
               held=row["held"], not_held_because=row["not_held_because"], cpu_cores=row["cpu_cores"],
               peak_rss_mib=row["peak_rss_mib"])
    return out


def late_records(prom_url: str, region: str) -> int:
    """The metrics job's late-record counter for ``region`` (records that missed their window; they still join
    the series' counters, which the ledger reads)."""
    from infersight.schemas import pipeline as P
    from infersight.simulator.prom import query

    rows = query(prom_url, f'sum({P.prom(P.LATE_RECORDS)}{{{P.LABEL_REGION}="{region}"}})', timeout_s=15)
    return int(float(rows[0]["value"][1])) if rows else 0


def link_cut(stack, rate: float, cut_s: float) -> dict[str, Any]:
    """The first region's link blackholed ``cut_s`` under traffic; that region's ledger and drain time."""
    from infersight.demo import endpoints_of
    from infersight.simulator.run import Simulator
    from infersight.stack.multiregion import link

    lay = stack.layout
    region = lay.regions[0]
    tag = uuid.uuid4().hex[:6]
    late_before = late_records(lay.prometheus_url, region)
    watch = StatusWatch(lay)
    watch.start()
    sim = Simulator(fleet(tag, rate), endpoints_of(stack), seed=60).start()
    time.sleep(20)
    link(lay, region, "cut")
    cut_at = time.monotonic()
    time.sleep(cut_s)
    link(lay, region, "heal")
    healed = time.monotonic()
    time.sleep(10)
    delivered = sim.stop(flush_s=60)
    sent_region = {k: n for k, n in sent_per_series(sim.ledger).items() if k[0] == region}
    keep = keep_event_time_moving(endpoints_of(stack), tag)
    drain_s = None
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            counted = {k: n for k, n in counted_per_series(lay.prometheus_url, tag).items() if k[0] == region}
            if counted == sent_region:
                drain_s = round(time.monotonic() - healed, 1)
                break
            time.sleep(1)
        settle(lay.prometheus_url, {tag: sim.ledger}, timeout_s=60, quiet_s=30)
    finally:
        keep.stop()
        watch.stop()
    t = tally(sent_region, {k: n for k, n in counted_per_series(lay.prometheus_url, tag).items() if k[0] == region})
    out = {"region": region, "cut_s": cut_s, "sent": t.sent, "lost": t.lost, "double": t.double,
           "delivered": delivered, "late_records": late_records(lay.prometheus_url, region) - late_before}
    if drain_s is not None:  # absent when the region never equalled its ledger (then lost/double say why)
        out["drain_s"] = drain_s
    out.update(status_figures(watch, [region], cut_at, healed + (drain_s if drain_s is not None else 0.0), healed))
    return out


def status_figures(watch: StatusWatch, regions: list[str], fault_at: float, until: float,
                   healed: float | None = None) -> dict[str, Any]:
    """The region status through a fault that delays ``regions``' telemetry (a cut link, a dead MM2), from
    ``fault_at`` to ``until`` (monotonic): ``status_detected_s`` (the first ``link_delayed`` of any of them;
    absent when none came, e.g. MM2 back before the lag bound), ``wrong_status`` (seconds of any of them in
    ``gateways_down`` or ``no_traffic``: contradicting a delay) and, given ``healed``, ``status_ok_after_heal_s``.
    Empty when the status service never answered."""
    from infersight.schemas import region_status as RS

    if not watch.samples:
        return {}
    out: dict[str, Any] = {}
    detected = [d for r in regions if (d := watch.first(r, RS.LINK_DELAYED, fault_at, until)) is not None]
    if detected:
        out["status_detected_s"] = round(min(detected), 1)
    out["wrong_status"] = round(0.0 + sum(watch.seconds_in(r, {RS.GATEWAYS_DOWN, RS.NO_TRAFFIC}, fault_at, until)
                                    for r in regions), 1)
    if healed is not None:
        ok_after = [watch.first(r, RS.OK, healed) for r in regions]
        if all(x is not None for x in ok_after):
            out["status_ok_after_heal_s"] = round(max(ok_after), 1)
    out["status_transitions"] = {r: watch.transitions(r, fault_at) for r in regions}
    return out


def mm2_kill9(stack, rate: float) -> dict[str, Any]:
    """``kill -9`` of MirrorMaker 2 under traffic (the supervisor restarts it): every region's ledger, and the
    seconds from the kill until mirrored data moves again (``moving_s``) and until the mirror lag is back under
    2 s (``drain_s``: the backlog of the dead time is through)."""
    import os
    import signal

    from infersight.demo import endpoints_of
    from infersight.simulator.run import Simulator
    from infersight.stack.multiregion import MIRRORMAKER

    lay = stack.layout
    tag = uuid.uuid4().hex[:6]
    resumed = MirrorResumed(lay.kafka_bootstrap, lay.normalize_sources())
    resumed.start()
    watch = StatusWatch(lay)
    watch.start()
    sim = Simulator(fleet(tag, rate), endpoints_of(stack), seed=61).start()
    time.sleep(20)
    pid = stack.running_components()[MIRRORMAKER]
    killed = time.time()
    killed_mono = time.monotonic()
    resumed.arm(killed)
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 180
    while resumed.caught_up_at is None and time.monotonic() < deadline:
        time.sleep(0.5)
    caught_up_mono = time.monotonic()
    time.sleep(10)
    delivered = sim.stop(flush_s=60)
    resumed.stop_event.set()
    watch.stop()
    keep = keep_event_time_moving(endpoints_of(stack), tag)
    try:
        settle(lay.prometheus_url, {tag: sim.ledger}, timeout_s=180, quiet_s=30)
    finally:
        keep.stop()
    t = tally(sent_per_series(sim.ledger), counted_per_series(lay.prometheus_url, tag))
    out: dict[str, Any] = {"sent": t.sent, "lost": t.lost, "double": t.double, "delivered": delivered,
                           "restarted": stack.running_components().get(MIRRORMAKER) not in (None, pid)}
    for key, at in (("moving_s", resumed.moving_at), ("drain_s", resumed.caught_up_at)):
        if at is not None:  # absent when it never happened within 3 minutes
            out[key] = round(at - killed, 1)
    out.update(status_figures(watch, list(lay.regions), killed_mono, caught_up_mono))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000.0, help="offered requests/s (all regions)")
    parser.add_argument("--step-s", type=float, default=120.0, help="seconds of traffic per topology")
    parser.add_argument("--cut-s", type=float, default=60.0, help="the link cut's length")
    parser.add_argument("--faults", default="link_cut,mm2_kill9", help="multi-region faults after the step")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    if set(faults) - {"link_cut", "mm2_kill9"}:
        parser.error(f"unknown faults {sorted(set(faults) - {'link_cut', 'mm2_kill9'})}: link_cut, mm2_kill9")

    from infersight.stack import setup

    started = time.monotonic()
    setup.ensure_all()
    result: dict[str, Any] = {"rate": args.rate, "step_s": args.step_s}
    for topology, key in (("single", "single"), ("multi-region", "multi_region")):
        print(f"[multiregion] {topology}: {args.rate:,.0f} requests/s for {args.step_s:.0f} s", flush=True)
        stack = start(topology)
        try:
            result["regions"] = list(stack.layout.regions)
            row = measure(stack, args.rate, args.step_s)
            mirror_keys = ("mirror_lag_p50_s", "mirror_lag_p99_s", "mirror_lag_records", "link_bytes_per_request",
                           "mm2_cpu_cores", "mm2_rss_mb")
            for k in mirror_keys:
                if row.get(k) is not None:
                    result[k] = row.pop(k)
                row.pop(k, None)
            result[key] = row
            print(f"[multiregion] {topology}: {json.dumps(row)}", flush=True)
            if topology == "multi-region" and "link_cut" in faults:
                result["link_cut_60s" if args.cut_s == 60 else f"link_cut_{args.cut_s:.0f}s"] = \
                    link_cut(stack, args.rate, args.cut_s)
            if topology == "multi-region" and "mm2_kill9" in faults:
                result["mm2_kill9"] = mm2_kill9(stack, args.rate)
                print(f"[multiregion] mm2_kill9: {json.dumps(result['mm2_kill9'])}", flush=True)
        finally:
            stack.down(wipe=True)
    result["wall_s"] = round(time.monotonic() - started, 1)
    save_results(args.results, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
