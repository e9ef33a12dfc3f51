"""The simulator's real-time loop: every tick draw the requests that ended in it, encode them, hand them
to the per-region senders, and count them in the ledger; pod gauges every ``gauge_interval_s``.

Runs in the foreground (``infersight simulate``) or in a thread (``Simulator.start``, for the demo, the
tests and the benchmark); ``set_rate`` changes the offered load on the fly (the benchmark's ramp)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from infersight.schemas.units import NS
from infersight.simulator.encode import Encoder, gauges
from infersight.simulator.export import Exporter
from infersight.simulator.fleet import FleetSpec
from infersight.simulator.ledger import Ledger
from infersight.simulator.workload import Fleet, pod_gauges


@dataclass
class Progress:
    elapsed_s: float
    sent: int
    rate_rps: float          # offered (configured) rate now
    achieved_rps: float      # requests generated per wall second over the last interval
    behind_s: float          # how far generation lags its schedule (0 when keeping up)
    backlog: int             # exports queued, not yet acknowledged
    retries: int


class Simulator:
    def __init__(self, spec: FleetSpec, endpoints: dict[str, str], seed: int = 1, tick_s: float = 0.1) -> None:
        missing = {r.name for r in spec.regions} - set(endpoints)
        if missing:
            raise ValueError(f"no gateway endpoint for regions {sorted(missing)}")
        self.spec, self.seed, self.tick_s = spec, seed, tick_s
        self.fleet = Fleet(spec, seed)
        self.encoder = Encoder(self.fleet.pods, spec.judge_rate)
        self.exporter = Exporter({r.name: endpoints[r.name] for r in spec.regions})
        self.ledger = Ledger()
        self._scale = 1.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.started_ns = 0
        self.behind_s = 0.0

    # ---- control ----
    def set_rate(self, rate_rps: float) -> None:
        """Offer ``rate_rps`` from the next tick on (pods stay as sized for the spec's rate)."""
        self._scale = rate_rps / self.spec.rate_rps

    @property
    def rate_rps(self) -> float:
        return self.spec.rate_rps * self._scale

    def start(self) -> Simulator:
        self._thread = threading.Thread(target=self.run, name="simulator", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_s: float = 120.0) -> bool:
        """Stop generating, wait until every export is acknowledged; False if some were not."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        delivered = self.exporter.flush(flush_s)
        self.exporter.close()
        return delivered

    def snapshot(self) -> Ledger:
        with self._lock:
            return replace(self.ledger, requests=self.ledger.requests.copy(), errors=self.ledger.errors.copy(),
                           output_tokens=self.ledger.output_tokens.copy(), by_second=self.ledger.by_second.copy())

    # ---- loop ----
    def run(self, duration_s: float | None = None, on_progress=None, every_s: float = 5.0) -> Ledger:
        dt_ns = int(self.tick_s * NS)
        t0 = time.time_ns() // dt_ns * dt_ns
        self.started_ns = t0
        gauge_every = max(1, round(self.spec.gauge_interval_s / self.tick_s))
        rng = np.random.default_rng([self.seed, 1 << 40])
        last_report, last_sent = time.monotonic(), 0
        k = 0
        while not self._stop.is_set():
            due_ns = t0 + (k + 1) * dt_ns  # the tick's requests have all ended by then
            if duration_s is not None and due_ns - t0 > duration_s * NS:
                break
            wait = (due_ns - time.time_ns()) / NS
            if wait > 0:
                if self._stop.wait(wait):
                    break
            self.behind_s = max(0.0, -wait)
            tick = self.fleet.tick(k, t0, self.tick_s, self._scale)
            for region, payloads in self.encoder.spans(tick).items():
                for payload in payloads:
                    self.exporter.submit(region, "traces", payload)
            with self._lock:
                self.ledger.add(tick, self.fleet.pods)
            if k % gauge_every == 0:
                state = self.fleet.pod_state(k * self.tick_s, self._scale)
                values = {name: v.tolist() for name, v in pod_gauges(self.fleet, state, rng).items()}
                up = [i for i in range(len(self.fleet.pods)) if not state.down[i]]
                for region, payload in gauges(self.fleet.pods, values, due_ns, up).items():
                    self.exporter.submit(region, "metrics", payload)
            k += 1
            now = time.monotonic()
            if on_progress is not None and now - last_report >= every_s:
                sent = self.ledger.total
                on_progress(self.progress(achieved=(sent - last_sent) / (now - last_report)))
                last_report, last_sent = now, sent
        return self.ledger

    def progress(self, achieved: float = 0.0) -> Progress:
        stats = self.exporter.stats()
        return Progress(elapsed_s=(time.time_ns() - self.started_ns) / NS if self.started_ns else 0.0,
                        sent=self.ledger.total, rate_rps=self.rate_rps, achieved_rps=achieved,
                        behind_s=self.behind_s, backlog=self.exporter.backlog(),
                        retries=sum(s.retries for s in stats.values()))
