"""Freshness and cost of mirroring (issue #25 item 5, first figures): the same fixed rate through both
topologies, then the multi-region faults of issue #25 item 4 (``bench/region_faults.py``).

    .venv/bin/python -m bench.multiregion                      # 1,000 requests/s, 120 s per topology, every fault
    .venv/bin/python -m bench.multiregion --rate 500 --step-s 60 --faults link_cut_60s,mm2_kill9
    .venv/bin/python -m bench.multiregion --faults "" --max-rate 2000,5000,10000   # the highest rate held
    .venv/bin/python -m bench.multiregion --rate 5000 --fault-rate 2000 --max-rate 2000,3500,8000,10000   # the issue's

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
- then every fault of ``--faults`` (default: all), one at a time, each under ``--rate`` with its own simulator
  tag: ``link_cut_60s``, ``link_reset``, ``link_flap``, ``regional_kafka_down``, ``gateways_down``,
  ``mm2_kill9``, ``global_kafka_kill9``, ``link_cut_300s`` (what each does and the figures it gets, ``sent``,
  ``lost``, ``double``, ``drain_s``, ``status_detected_s``, ``wrong_status``, ``status_ok_after_heal_s``: see
  ``bench/region_faults.py``);
- with ``--max-rate 2000,5000,10000``, after the faults: steps at those rates, each judged as the throughput
  bench judges a step (above ``--rate`` if its step held, else below it, falling); ``max_zero_loss_rate`` under
  ``multi_region`` (not in the default run).

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

from bench.region_faults import FAULTS, run_fault
from bench.results_file import save_results
from bench.throughput import judge, run_step
from tests.support.pipeline_load import WindowWatcher, fleet, keep_event_time_moving, settle

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


def max_zero_loss_rate(stack, rates: list[float], step_s: float, held: float = 0.0,
                       falling: bool = False) -> dict[str, Any]:
    """Steps at ``rates`` on the multi-region stack, each judged as the throughput bench judges a step (``judge``:
    every request counted once, the simulator on schedule, freshness p99 <= 20 s): rising, they stop at the first
    step not held; ``falling`` (the freshness step did not hold), at the first step held. ``max_zero_loss_rate``:
    the highest rate held, ``held`` (the freshness step's rate, if it held) included (0 if none)."""
    steps = []
    for rate in rates:
        print(f"[multiregion] max rate: {rate:,.0f} requests/s for {step_s:.0f} s", flush=True)
        row = measure(stack, rate, step_s)
        steps.append({"rate": rate, **{k: row.get(k) for k in ("held", "not_held_because", "sent", "lost", "double",
                                                              "freshness_p50_s", "freshness_p99_s")}})
        print(f"[multiregion] max rate: {json.dumps(steps[-1])}", flush=True)
        if row["held"] == falling:
            break
    return {"max_zero_loss_rate": max((s["rate"] for s in steps if s["held"]), default=held), "rate_steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=1000.0, help="offered requests/s (all regions)")
    parser.add_argument("--step-s", type=float, default=120.0, help="seconds of traffic per topology")
    parser.add_argument("--fault-rate", type=float,
                        help="requests/s during the faults (default: --rate; the issue's figures: freshness at 5,000, "
                             "the cuts at 2,000)")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"multi-region faults after the step, comma-separated (default: all: {', '.join(FAULTS)})")
    parser.add_argument("--max-rate", help="also steps at these rising rates on the multi-region stack, after the "
                                           "faults (e.g. 2000,5000,10000): max_zero_loss_rate")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        parser.error(f"unknown faults {unknown}: the faults are {', '.join(FAULTS)}")
    try:
        rates = sorted(float(r) for r in args.max_rate.split(",") if r) if args.max_rate else []
    except ValueError:
        parser.error(f"--max-rate takes requests/s separated by commas (e.g. 2000,5000,10000), not {args.max_rate!r}")

    from infersight.stack import setup

    started = time.monotonic()
    setup.ensure_all()
    fault_rate = args.fault_rate or args.rate
    result: dict[str, Any] = {"rate": args.rate, "fault_rate": fault_rate, "step_s": args.step_s}
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
            if topology != "multi-region":
                continue
            for seed, fault in enumerate(faults, start=60):
                print(f"[multiregion] {fault} at {fault_rate:,.0f} requests/s", flush=True)
                try:
                    result[fault] = run_fault(stack, fault, fault_rate, seed)
                except Exception as exc:  # noqa: BLE001 - one fault that breaks is a figure too; go on
                    result[fault] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"[multiregion] {fault}: {json.dumps(result[fault])}", flush=True)
                save_results(args.results, result)  # what is measured so far survives a later failure
            if rates:
                if row["held"]:  # higher rates until one does not hold
                    row.update(max_zero_loss_rate(stack, [r for r in rates if r > args.rate], args.step_s, args.rate))
                else:  # lower rates until one holds
                    row.update(max_zero_loss_rate(stack, sorted((r for r in rates if r < args.rate), reverse=True),
                                                  args.step_s, falling=True))
        finally:
            stack.down(wipe=True)
    result["wall_s"] = round(time.monotonic() - started, 1)
    save_results(args.results, result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
