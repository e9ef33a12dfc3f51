"""Watch the region status service of a multi-region stack (tests and bench/multiregion.py): every region's
status sampled twice a second, so a test asserts when a status came and that another never did."""

from __future__ import annotations

import threading
import time


class StatusWatch(threading.Thread):
    """Samples ``GET /status`` of the stack's region status service every ``every_s`` (monotonic time)."""

    def __init__(self, layout, every_s: float = 0.5) -> None:
        super().__init__(daemon=True, name="status-watch")
        self.layout, self.every_s = layout, every_s
        self.samples: list[tuple[float, dict[str, dict]]] = []
        self.errors = 0
        self.stop_event = threading.Event()

    def run(self) -> None:
        from infersight.stack import multiregion

        while not self.stop_event.is_set():
            try:
                self.samples.append((time.monotonic(), multiregion.statuses(self.layout)))
            except OSError:
                self.errors += 1
            self.stop_event.wait(self.every_s)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(5)

    def series(self, region: str, after: float = 0.0, until: float = float("inf")) -> list[tuple[float, dict]]:
        return [(t, s[region]) for t, s in list(self.samples) if after <= t <= until and region in s]

    def first(self, region: str, status: str, after: float, until: float = float("inf")) -> float | None:
        """Seconds from ``after`` to the first sample of ``region`` in ``status``; None if none came."""
        return next((t - after for t, r in self.series(region, after, until) if r["status"] == status), None)

    def first_where(self, region: str, after: float, test) -> float | None:
        return next((t for t, r in self.series(region, after) if test(r)), None)

    def seen(self, region: str, after: float, until: float = float("inf")) -> set[str]:
        return {r["status"] for _, r in self.series(region, after, until)}

    def seconds_in(self, region: str, statuses: set[str], after: float, until: float = float("inf")) -> float:
        """How long ``region`` was in one of ``statuses`` between ``after`` and ``until`` (sample to sample)."""
        rows = self.series(region, after, until)
        return sum(t2 - t1 for (t1, r), (t2, _) in zip(rows, rows[1:], strict=False) if r["status"] in statuses)

    def wait_for(self, region: str, status: str, after: float, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            took = self.first(region, status, after)
            if took is not None:
                return took
            time.sleep(0.25)
        return self.first(region, status, after)

    def transitions(self, region: str, after: float = 0.0) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        for t, r in self.series(region, after):
            if not out or out[-1][1] != r["status"]:
                out.append((round(t - after, 1), r["status"]))
        return out
