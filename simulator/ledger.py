"""What the simulator sent, kept by the simulator itself: requests per series (region, model, version,
track), errors, tokens, and requests per second of end time (for freshness). The fault-tolerance tests
and the throughput benchmark compare Prometheus against it."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from infersight.schemas.units import NS
from infersight.simulator.workload import Pod, Tick


@dataclass
class Ledger:
    requests: Counter = field(default_factory=Counter)      # (region, model, version, track) -> n
    errors: Counter = field(default_factory=Counter)        # same key -> n
    output_tokens: Counter = field(default_factory=Counter)
    by_second: Counter = field(default_factory=Counter)     # end second (unix) -> n
    first_end_ns: int = 0
    last_end_ns: int = 0

    def add(self, tick: Tick, pods: list[Pod]) -> None:
        if not len(tick):
            return
        per_pod = np.bincount(tick.pod, minlength=len(pods))
        err_pod = np.bincount(tick.pod[tick.error >= 0], minlength=len(pods))
        tok_pod = np.bincount(tick.pod, weights=tick.tokens_out, minlength=len(pods))
        for i in np.flatnonzero(per_pod):
            p = pods[i]
            key = (p.region.name, p.model.name, p.version, p.track)
            self.requests[key] += int(per_pod[i])
            self.errors[key] += int(err_pod[i])
            self.output_tokens[key] += int(tok_pod[i])
        seconds, counts = np.unique(tick.end_ns // NS, return_counts=True)
        for s, c in zip(seconds.tolist(), counts.tolist(), strict=True):
            self.by_second[s] += c
        self.first_end_ns = self.first_end_ns or int(tick.end_ns[0])
        self.last_end_ns = int(tick.end_ns[-1])

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    def by(self, level: str) -> Counter:
        """Requests per region (``level="region"``) or per model."""
        i = {"region": 0, "model": 1, "version": 2, "track": 3}[level]
        out: Counter = Counter()
        for key, n in self.requests.items():
            out[key[i]] += n
        return out

    def to_json(self) -> dict:
        return {"total": self.total, "errors": sum(self.errors.values()),
                "output_tokens": sum(self.output_tokens.values()),
                "requests": [{"region": k[0], "model": k[1], "model_version": k[2], "track": k[3], "requests": n,
                              "errors": self.errors[k], "output_tokens": self.output_tokens[k]}
                             for k, n in sorted(self.requests.items())],
                "first_end_ns": self.first_end_ns, "last_end_ns": self.last_end_ns}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))
