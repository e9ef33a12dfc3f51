"""The multi-region faults of issue #25 item 4, measured under traffic (run by ``bench/multiregion.py``, one at a
time on its multi-region stack, each with its own simulator tag so that no two faults' ledgers mix):

- ``link_cut_60s`` / ``link_cut_300s``: the first region's link relay blackholed 60 s / 300 s, then healed;
- ``link_reset``: its connections reset and new ones refused for 60 s, then healed;
- ``link_flap``: cut and healed every 10 s for 2 minutes;
- ``regional_kafka_down``: its regional broker stopped for 60 s with the link up (its gateways queue on disk),
  then started again;
- ``gateways_down``: its gateways killed (``Stack.stop(grace_s=0)``: SIGKILL at once) with the link up, started
  again 60 s later;
- ``mm2_kill9``: MirrorMaker 2 ``kill -9``; the supervisor starts it again;
- ``global_kafka_kill9``: the global broker ``kill -9``; the supervisor starts it again and the Flink jobs
  recover from their checkpoints (Flink's restart strategy; no one resubmits them).

One runner for all (``run_fault``): the simulator's traffic for ``lead_s``, the fault injected, held (or
flapped), recovered, 10 s more traffic, then the ledger and the drain. Per fault:

- ``sent``, ``lost``, ``double``: the affected regions (the first region; every region for the MM2 and global
  broker kills), per series, a loss and a double count each summed on its own, never netted (``tally``).
  **What "sent" is.** The simulator's ledger counts a request when the fleet generates it, before it is
  exported (``simulator/run.py``); its exporter (``simulator/export.py``) retries every export a gateway
  refuses or fails (a dead gateway: UNAVAILABLE; a memory limiter pushing back) until one accepts it, and gives
  an export up only when ``Simulator.stop`` runs out of time. So ``sent`` is every request generated, and each
  was accepted by a gateway unless ``refused_exports`` says otherwise: exports the gateways never acknowledged
  when the simulator stopped (their requests then show in ``lost`` although the pipeline never had them, so a
  non-zero ``refused_exports`` makes ``lost`` an upper bound of the pipeline's loss). ``rejected_spans``: spans
  a gateway acknowledged as rejected (partial success); ``export_retries``: refusals the simulator retried
  (with a dead gateway: every try until it was back). A gateway whose regional broker is down still accepts:
  its Kafka exporters queue on disk (``collectors/gateway.yaml``), so nothing is refused then;
- ``drain_s``: from the recovery (the heal; the component healthy again) until the affected regions' counts in
  Prometheus equal their ledger; absent if that never happened within ``DRAIN_TIMEOUT_S``;
- ``late_records``: the affected regions' records the metrics job took as late meanwhile (issue #25 item 3: they
  join the counters but miss their windows; with catch-up windows, at most the remainder of the window a cut fell
  in, whose partial result had fired), and ``windowed``: their requests that landed in their own windows
  (``infersight_window_requests`` summed over windows), so ``windowed + late_records = sent`` when nothing is lost;
- from the region status service, sampled twice a second (``status_figures``): ``status_detected_s`` (the fault
  -> the first status it should produce), ``wrong_status`` (seconds, from the fault to the drain, the affected
  regions spent in a status that contradicts the fault), ``status_ok_after_heal_s`` (the recovery -> ``ok``
  again), ``other_regions_not_ok_s`` (seconds the unaffected regions spent in any status but ``ok``) and the
  transitions.

What each fault should produce, and what contradicts it:

- the link faults: ``link_delayed`` (cause ``link``); ``gateways_down`` and ``no_traffic`` contradict (the
  region serves and its gateways write; only the link is away). A flap may show ``ok`` while the link is up:
  that is no contradiction;
- ``regional_kafka_down``: the status service probes the regional cluster through the link, and a stopped
  broker answers no probe, so the region is ``link_delayed`` with cause ``link``, like a cut link, and its reason
  carries the probe's error (measured: "No leaders found" while it shuts down, then time-outs). That is the truth
  from the global side: the gateways queue on disk, the telemetry is late, not lost. ``gateways_down`` and
  ``no_traffic`` contradict (the judge gives the gateways a beacons' timeout after the broker answers again:
  their queued beacons land seconds after its first answer);
- ``gateways_down``: ``gateways_down``; ``link_delayed`` contradicts (the link is up);
- ``mm2_kill9``: ``link_delayed`` (cause ``mirror``) for every region, absent when MM2 moved again before the
  status's lag bound; ``gateways_down`` and ``no_traffic`` contradict;
- ``global_kafka_kill9``: every region keeps serving and writing to its own broker, and the probes through the
  links keep answering; what stops is the mirror into the global cluster and every job reading it, so the
  expected status is ``link_delayed`` (cause ``mirror``: the mirrored beacons fall behind), absent when the broker
  was back before the lag bound. ``gateways_down`` and ``no_traffic`` contradict: either would blame the regions
  for the global side's outage (and page, for ``gateways_down``). The status service runs on the global side
  but judges from memory and answers ``/status`` while its broker is away (its records for the topic wait).

The kills also report ``back_s`` (kill -> the new process healthy) and ``moving_s`` (kill -> the first mirrored
record created after it reaches the global broker's ``read_committed`` readers).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from tests.support import fault_injection
from tests.support.pipeline_load import (
    MirrorResumed,
    counted_per_series,
    fleet,
    keep_event_time_moving,
    late_per_region,
    sent_per_series,
    settle,
    tally,
    windowed_per_region,
)
from tests.support.region_status import StatusWatch

DRAIN_TIMEOUT_S = 300.0
LEAD_S = 20.0         # traffic before the fault: every region counted and ok
AFTER_S = 10.0        # traffic after the recovery
FLAP_EVERY_S = 10.0
FLAP_FOR_S = 120.0
OUTAGE_S = 60.0

# (fault at, recovered at or None if never, extra figures), monotonic: what a fault's action returns
Injected = tuple[float, float | None, dict[str, Any]]


@dataclass(frozen=True)
class Fault:
    """What a fault does (``act(stack, region)``) and what the region status should say through it."""

    act: Callable[[Any, str], Injected]
    expect: str                   # the first status the fault should produce
    contradicts: frozenset[str]   # statuses that say something else happened
    every_region: bool = False    # a global fault: every region's ledger and status


def link_outage(action: str, hold_s: float, stack, region: str) -> Injected:
    from infersight.stack.multiregion import link

    link(stack.layout, region, action)
    at = time.monotonic()
    time.sleep(hold_s)
    link(stack.layout, region, "heal")
    return at, time.monotonic(), {}


def link_flap(stack, region: str) -> Injected:
    at = time.monotonic()
    cuts = fault_injection.flap_link(stack.layout, region, FLAP_EVERY_S, FLAP_FOR_S)
    return at, time.monotonic(), {"cuts": cuts}


def component_outage(component: Callable[[str], str], grace_s: float, stack, region: str) -> Injected:
    at, back = fault_injection.outage(stack, component(region), OUTAGE_S, grace_s)
    return at, back, {"back_s": round(back - at - OUTAGE_S, 1)}  # start-up after the hold


def kill9(component: str, stack, region: str) -> Injected:
    at, back = fault_injection.kill9(stack, component)
    return at, back, {"back_s": None if back is None else round(back - at, 1)}


def faults() -> dict[str, Fault]:
    from infersight.schemas import region_status as RS
    from infersight.stack.multiregion import MIRRORMAKER

    not_serving = frozenset({RS.GATEWAYS_DOWN, RS.NO_TRAFFIC})  # contradicts a delay: the region serves
    return {
        "link_cut_60s": Fault(partial(link_outage, "cut", 60.0), RS.LINK_DELAYED, not_serving),
        "link_cut_300s": Fault(partial(link_outage, "cut", 300.0), RS.LINK_DELAYED, not_serving),
        "link_reset": Fault(partial(link_outage, "reset", 60.0), RS.LINK_DELAYED, not_serving),
        "link_flap": Fault(link_flap, RS.LINK_DELAYED, not_serving),
        "regional_kafka_down": Fault(partial(component_outage, lambda r: f"kafka-{r}", 20.0), RS.LINK_DELAYED,
                                     not_serving),
        "gateways_down": Fault(partial(component_outage, lambda r: f"gateway-{r}", 0.0), RS.GATEWAYS_DOWN,
                               frozenset({RS.LINK_DELAYED})),
        "mm2_kill9": Fault(partial(kill9, MIRRORMAKER), RS.LINK_DELAYED, not_serving, every_region=True),
        "global_kafka_kill9": Fault(partial(kill9, "kafka"), RS.LINK_DELAYED, not_serving, every_region=True),
    }


FAULTS = ("link_cut_60s", "link_reset", "link_flap", "regional_kafka_down", "gateways_down", "mm2_kill9",
          "global_kafka_kill9", "link_cut_300s")  # the order they run in: the longest last


def status_figures(watch: StatusWatch, regions: list[str], fault_at: float, until: float, healed: float,
                   expect: str, contradicts: frozenset[str]) -> dict[str, Any]:
    """The region status of ``regions`` through a fault, from ``fault_at`` to ``until`` (monotonic):
    ``status_detected_s`` (the first ``expect`` of any of them; absent when none came, e.g. MM2 back before the
    lag bound), ``wrong_status`` (seconds of any of them in one of ``contradicts``) and ``status_ok_after_heal_s``
    (``healed`` -> every one of them ``ok``). Empty when the status service never answered."""
    from infersight.schemas import region_status as RS

    if not watch.samples:
        return {}
    out: dict[str, Any] = {}
    detected = [d for r in regions if (d := watch.first(r, expect, fault_at, until)) is not None]
    if detected:
        out["status_detected_s"] = round(min(detected), 1)
    out["wrong_status"] = round(0.0 + sum(watch.seconds_in(r, set(contradicts), fault_at, until) for r in regions), 1)
    ok_after = [watch.first(r, RS.OK, healed) for r in regions]
    if all(x is not None for x in ok_after):
        out["status_ok_after_heal_s"] = round(max(ok_after), 1)
    out["status_transitions"] = {r: watch.transitions(r, fault_at) for r in regions}
    return out


def run_fault(stack, name: str, rate: float, seed: int, lead_s: float = LEAD_S) -> dict[str, Any]:
    """One fault under ``rate`` requests/s of its own tag; its figures (see the module's docstring)."""
    from infersight.demo import endpoints_of
    from infersight.schemas import region_status as RS
    from infersight.simulator.run import Simulator

    fault = faults()[name]
    lay = stack.layout
    regions = list(lay.regions) if fault.every_region else [lay.regions[0]]
    others = [r for r in lay.regions if r not in regions]
    tag = uuid.uuid4().hex[:6]
    late_before = late_per_region(lay.prometheus_url)
    watch = StatusWatch(lay)
    watch.start()
    resumed = MirrorResumed(lay.kafka_bootstrap, lay.normalize_sources()) if fault.every_region else None
    if resumed is not None:
        resumed.start()
    sim = Simulator(fleet(tag, rate), endpoints_of(stack), seed=seed).start()
    keep = None
    try:
        time.sleep(lead_s)
        armed = time.time()
        if resumed is not None:
            resumed.arm(armed)
        fault_at, recovered, extra = fault.act(stack, regions[0])
        recovered = recovered if recovered is not None else time.monotonic()  # never back: from now on
        time.sleep(AFTER_S)
        delivered = sim.stop(flush_s=120)
        stats = sim.exporter.stats().values()
        sent = {k: n for k, n in sent_per_series(sim.ledger).items() if k[0] in regions}
        keep = keep_event_time_moving(endpoints_of(stack), tag)
        drain_s = None
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline:
            if {k: n for k, n in counted_per_series(lay.prometheus_url, tag).items() if k[0] in regions} == sent:
                drain_s = round(time.monotonic() - recovered, 1)
                break
            time.sleep(1)
        drained = recovered + (drain_s if drain_s is not None else DRAIN_TIMEOUT_S)
        settle(lay.prometheus_url, {tag: sim.ledger}, timeout_s=60, quiet_s=30)
    finally:
        if keep is not None:
            keep.stop()
        watch.stop()
        if resumed is not None:
            resumed.stop_event.set()
    t = tally(sent, {k: n for k, n in counted_per_series(lay.prometheus_url, tag).items() if k[0] in regions})
    out: dict[str, Any] = {
        "regions": regions, "sent": t.sent, "lost": t.lost, "double": t.double, "series_off": t.to_json()["series_off"],
        "delivered": delivered, "refused_exports": sum(s.dropped + s.queued for s in stats),
        "rejected_spans": sum(s.rejected for s in stats), "export_retries": sum(s.retries for s in stats),
        "late_records": sum(n - late_before.get(r, 0) for r, n in late_per_region(lay.prometheus_url).items()
                            if r in regions),
        "windowed": sum(n for r, n in windowed_per_region(lay.prometheus_url, tag).items() if r in regions),
        "fault_s": round(recovered - fault_at, 1), **extra}
    if drain_s is not None:  # absent when the regions never equalled their ledger (then lost/double say why)
        out["drain_s"] = drain_s
    if resumed is not None and resumed.moving_at is not None:
        out["moving_s"] = round(resumed.moving_at - armed, 1)
    out.update(status_figures(watch, regions, fault_at, drained, recovered, fault.expect, fault.contradicts))
    if watch.samples:
        not_ok = set(RS.STATUSES) - {RS.OK}
        out["other_regions_not_ok_s"] = round(0.0 + sum(watch.seconds_in(r, not_ok, fault_at, drained)
                                                        for r in others), 1)
    return out
