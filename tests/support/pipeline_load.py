"""Driving the whole pipeline with the fleet simulator and holding Prometheus to its ledger, shared by the
fault-tolerance and supervision tests and the throughput and fault benchmarks.

- ``fleet(tag, rate)``: the default fleet with every model renamed ``<model>-<tag>``, so one run's (one
  step's, one fault's) requests are counted apart from everything else on the stack.
- ``counted_per_series`` / ``tally``: requests per series (region, model, model_version, track) in
  Prometheus against the ledger, a loss and a double count each summed on its own, never netted:
  ``lost = sum over series of max(0, sent - counted)``, ``double = sum of max(0, counted - sent)``.
- ``settle``: wait, with traffic of a throwaway model keeping event time moving, until every run's series
  equal its ledger or stop changing.
- ``WindowWatcher``: when each window of the watched models first appears in Prometheus, per region.
- ``task_manager_of``: which task manager runs a job (the one to kill).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infersight.schemas import pipeline as P
from infersight.simulator.fleet import DEFAULT_MODELS, FleetSpec

SeriesKey = tuple[str, str, str, str]  # region, model, model_version, track: the ledger's key
SERIES = (P.LABEL_REGION, P.LABEL_MODEL, P.LABEL_MODEL_VERSION, P.LABEL_TRACK)
REQUESTS = P.prom(P.REQUESTS)
WINDOW_REQUESTS = P.prom(P.WINDOW_REQUESTS)
LOOKBACK_S = 3 * 3600  # counters are read as their newest sample within this (a run's series go stale after 5 min)


def fleet(tag: str, rate: float, models=DEFAULT_MODELS) -> FleetSpec:
    return FleetSpec(rate_rps=rate, models=tuple(dataclasses.replace(m, name=f"{m.name}-{tag}") for m in models),
                     diurnal_amplitude=0.0)


def models_of(tag: str) -> str:
    """The PromQL matcher of a tag's models."""
    return f'{P.LABEL_MODEL}=~".*-{tag}"'


def _query(prom_url: str, promql: str) -> list[dict[str, Any]]:
    from infersight.simulator.prom import query

    return query(prom_url, promql, timeout_s=15)


def counted_per_series(prom_url: str, tag: str, lookback_s: int = LOOKBACK_S) -> dict[SeriesKey, int]:
    """Requests counted per series (regional counters, every engine summed), each at its newest sample."""
    selector = f'{REQUESTS}{{{models_of(tag)},{P.LABEL_REGION}!="{P.GLOBAL_REGION}"}}'
    promql = f"sum by ({', '.join(SERIES)}) (last_over_time({selector}[{int(lookback_s)}s]))"
    return {tuple(s["metric"].get(label, "") for label in SERIES): int(float(s["value"][1]))  # type: ignore[misc]
            for s in _query(prom_url, promql)}


def counted_per_region(prom_url: str, tag: str) -> dict[str, int]:
    """Requests counted per region now (regional counters)."""
    selector = f'{REQUESTS}{{{models_of(tag)},{P.LABEL_REGION}!="{P.GLOBAL_REGION}"}}'
    return {s["metric"][P.LABEL_REGION]: int(float(s["value"][1]))
            for s in _query(prom_url, f"sum by ({P.LABEL_REGION}) ({selector})")}


def windowed_per_region(prom_url: str, tag: str, lookback_s: int = 1800) -> dict[str, int]:
    """Requests per region summed over every window's point (``infersight_window_requests``: one point per series
    and window): what landed in its own window; the counters less this are the late records."""
    selector = f'{P.prom(P.WINDOW_REQUESTS)}{{{models_of(tag)},{P.LABEL_REGION}!="{P.GLOBAL_REGION}"}}'
    return {s["metric"][P.LABEL_REGION]: int(float(s["value"][1]))
            for s in _query(prom_url, f"sum by ({P.LABEL_REGION}) (sum_over_time({selector}[{int(lookback_s)}s]))")}


def late_per_region(prom_url: str, lookback_s: int = 3 * 3600) -> dict[str, int]:
    """The metrics job's late-record counter per region (records that missed their window; they still join the
    series' counters). Read over ``lookback_s``: a counter that stopped moving has samples older than an instant
    query's look-back."""
    rows = _query(prom_url, f"sum by ({P.LABEL_REGION}) (last_over_time({P.prom(P.LATE_RECORDS)}[{int(lookback_s)}s]))")
    return {s["metric"][P.LABEL_REGION]: int(float(s["value"][1])) for s in rows}


@dataclass
class Tally:
    """One run's requests: sent (the ledger), counted (Prometheus), lost and double counted per series."""

    sent: int
    counted: int
    lost: int
    double: int
    off: dict[str, int] = field(default_factory=dict)  # "region/model/version/track" -> counted - sent, if not 0

    @property
    def exact(self) -> bool:
        return self.lost == 0 and self.double == 0

    def to_json(self, worst: int = 12) -> dict[str, Any]:
        off = dict(sorted(self.off.items(), key=lambda kv: -abs(kv[1]))[:worst])
        return {"sent": self.sent, "counted": self.counted, "lost": self.lost, "double": self.double,
                "series_off": off}


def tally(sent: Mapping[SeriesKey, int], counted: Mapping[SeriesKey, int]) -> Tally:
    """Per series: what Prometheus is short of the ledger is lost, what it has beyond it is double counted.
    A series only in Prometheus is all double, one only in the ledger all lost."""
    lost = double = 0
    off: dict[str, int] = {}
    for key in set(sent) | set(counted):
        diff = counted.get(key, 0) - sent.get(key, 0)
        if diff:
            off["/".join(key)] = diff
            lost += max(0, -diff)
            double += max(0, diff)
    return Tally(sum(sent.values()), sum(counted.values()), lost, double, off)


def sent_per_series(ledger) -> dict[SeriesKey, int]:
    return {key: n for key, n in ledger.requests.items() if n}


def settle(prom_url: str, runs: Mapping[str, Any], timeout_s: float = 600.0, quiet_s: float = 60.0,
           every_s: float = 3.0, log: Callable[[str], None] = lambda _: None) -> dict[str, Tally]:
    """Wait until every run (tag -> its ledger) is counted exactly per series, or nothing has changed for
    ``quiet_s`` (what is missing then is lost, what is over is double), or ``timeout_s``; returns the tallies.
    Something must keep event time moving meanwhile (``keep_event_time_moving``): the last windows close only
    when newer data arrives."""
    deadline = time.monotonic() + timeout_s
    last: dict[str, dict[SeriesKey, int]] | None = None
    changed_at = time.monotonic()
    while True:
        counts = {tag: counted_per_series(prom_url, tag) for tag in runs}
        tallies = {tag: tally(sent_per_series(ledger), counts[tag]) for tag, ledger in runs.items()}
        if all(t.exact for t in tallies.values()):
            return tallies
        if counts != last:
            last, changed_at = counts, time.monotonic()
            log("[settle] " + ", ".join(f"{tag}: sent {t.sent} counted {t.counted}" for tag, t in tallies.items()))
        now = time.monotonic()
        if now - changed_at > quiet_s or now > deadline:
            return tallies
        time.sleep(every_s)


def keep_event_time_moving(endpoints: dict[str, str], tag: str = "", rate: float = 30.0):
    """A started simulator of one throwaway model (``flush<tag>``): its traffic closes the others' last windows.
    Stop it when done."""
    from infersight.simulator.run import Simulator

    return Simulator(fleet(f"flush{tag}", rate, DEFAULT_MODELS[:1]), endpoints, seed=8).start()


class WindowWatcher(threading.Thread):
    """Polls Prometheus every second: when each window of the watched tags' models first appears, per region
    (the global roll-up under region ``global``)."""

    def __init__(self, prom_url: str, lookback_s: int = 600) -> None:
        super().__init__(daemon=True, name="window-watcher")
        self.prom_url, self.lookback_s = prom_url, lookback_s
        self.seen: dict[str, dict[tuple[str, int], float]] = {}  # tag -> (region, window end ms) -> first seen
        self.stop_event = threading.Event()

    def watch(self, tag: str) -> None:
        self.seen.setdefault(tag, {})

    def first_seen(self, tag: str, region: str = P.GLOBAL_REGION) -> dict[int, float]:
        """Window end (ms) -> when it first appeared (unix s), for one region."""
        return {end: t for (r, end), t in list(self.seen.get(tag, {}).items()) if r == region}

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            for tag in list(self.seen):
                try:
                    result = _query(self.prom_url, f"{WINDOW_REQUESTS}{{{models_of(tag)}}}[{self.lookback_s}s]")
                except Exception:  # noqa: BLE001 - Prometheus busy: next poll
                    continue
                now, seen = time.time(), self.seen[tag]
                for series in result:  # one per model and track: a window is in once any of them is
                    region = series["metric"].get(P.LABEL_REGION, "")
                    for ts, _value in series["values"]:
                        seen.setdefault((region, round(float(ts) * 1000)), now)


def task_manager_of(layout, job_id: str) -> str:
    """The resource id (the stack's component name) of a task manager running the job's tasks."""
    import json
    import urllib.request

    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{layout.flink_rest_url}{path}", timeout=10) as resp:
            return json.loads(resp.read())

    for vertex in get(f"/jobs/{job_id}")["vertices"]:
        for tm in get(f"/jobs/{job_id}/vertices/{vertex['id']}/taskmanagers").get("taskmanagers", ()):
            tm_id = tm.get("taskmanager-id") or tm.get("resource-id")
            if tm_id:
                return tm_id
    raise RuntimeError(f"no task manager runs job {job_id}")


def by_region(per_series: Iterable[tuple[SeriesKey, int]]) -> Counter:
    out: Counter = Counter()
    for key, n in per_series:
        out[key[0]] += n
    return out


class MirrorResumed(threading.Thread):
    """After ``arm(t)``: when the global broker's ``read_committed`` readers first receive a mirrored request
    record created after ``t`` (MM2 moves data again), and when the mirror lag is back under ``caught_up_s``
    (its backlog is through)."""

    def __init__(self, bootstrap: str, topics: list[str], caught_up_s: float = 2.0) -> None:
        super().__init__(daemon=True, name="mirror-resumed")
        import uuid

        from confluent_kafka import Consumer

        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"mirror-resumed-{uuid.uuid4().hex[:6]}",
                                  "auto.offset.reset": "latest", "isolation.level": "read_committed",
                                  "enable.auto.commit": False})
        self.consumer.subscribe(topics)
        self.caught_up_s = caught_up_s
        self.since: float | None = None
        self.moving_at: float | None = None
        self.caught_up_at: float | None = None
        self.stop_event = threading.Event()

    def arm(self, since: float) -> None:
        self.since = since

    def run(self) -> None:
        while not self.stop_event.is_set():
            for m in self.consumer.consume(500, timeout=0.2):
                now, created = time.time(), m.timestamp()[1] / 1000
                if m.error() is not None or self.since is None or created <= self.since:
                    continue
                self.moving_at = self.moving_at or now
                if self.caught_up_at is None and now - created <= self.caught_up_s:
                    self.caught_up_at = now
        self.consumer.close()
