"""Bounds on metric label values that requests supply: per label, at most N distinct values per period.

A serving pod's metric attribute sets are the product of a few labels. Region, model version, track, engine
and pod come from the pod's own settings and resource (one value each); the finish reason is checked
against the contract's fixed set. Two come from requests and are unbounded as given: the model a client
asks for (``gen_ai.request.model``) and the error type (an exception class or an error code). For each, the
first ``limit`` distinct values seen in a period are recorded as they are; a further new value is recorded
as ``_OTHER`` (semconv's fallback value) until the period ends, counted on the self-telemetry counter
(``cardinality_overflow``) and logged once per label. Spans keep the real values.

Cost: nothing per request once a value is admitted. ``admit`` runs only where the instrumentation's series
cache misses (a new value, a folded one, or the first request after a period ended): a set lookup, and on a
new value a lock and a clock read. A period ends lazily: the first new value after its end starts the next
one, and ``generation`` tells the caller to drop what it cached under the old one (admitted values are
admitted again as they come back).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from infersight.schemas.units import NS

# report(label, value, limit): one value not admitted (SelfTelemetry.folded, bound by the caller)
Report = Callable[[str, str, int], None]


class LabelBounds:
    """Per label (an attribute name), the values admitted in the current period, at most ``limits[label]``."""

    def __init__(self, limits: Mapping[str, int], period_s: float, clock: Callable[[], int], report: Report) -> None:
        self.limits = dict(limits)
        self.period_s = period_s
        self._period_ns = int(period_s * NS)
        self._clock = clock
        self._report = report
        self._seen: dict[str, set[str]] = {label: set() for label in self.limits}
        self._ends_ns: int | None = None  # the current period's end in ``clock``'s ns; None until the first value
        self._lock = threading.Lock()
        self.generation = 0  # +1 whenever a period ends: admissions cached under an older one are stale

    def admit(self, label: str, value: str) -> bool:
        """Whether ``value`` is among the first ``limits[label]`` distinct values of ``label`` this period; a
        value that is not is reported (the caller records it as ``_OTHER``)."""
        if value in self._seen[label]:
            return True
        with self._lock:
            now = self._clock()
            ends = self._ends_ns
            if ends is None or now >= ends:
                if ends is not None:  # a new period: every label starts empty
                    self._seen = {name: set() for name in self.limits}
                    self.generation += 1
                self._ends_ns = now + self._period_ns
            seen = self._seen[label]
            if value in seen or len(seen) < self.limits[label]:
                seen.add(value)
                return True
        self._report(label, value, self.limits[label])
        return False

    def admitted(self, label: str) -> frozenset[str]:
        """The values of ``label`` admitted this period (for tests and diagnostics)."""
        return frozenset(self._seen[label])
