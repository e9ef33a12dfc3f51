"""A bounded, mergeable, weighted reservoir of per-request values (Efraimidis–Spirakis A-Res): each value gets
the key ``log(u) / weight`` and the ``capacity`` largest keys are kept. With equal weights it is a uniform
sample of every value offered; with weights ``1 / sample_rate`` (a sampled quality judge) it is a sample of
the population the judged requests stand for, so an unweighted rank test on it estimates the population's.
Two reservoirs merge by keeping the largest keys of both (the overall verdict merges regions').
Weights act once the reservoir overflows (A-Res is proportional when the sample is small beside the
population); below capacity every value is kept, which is right when one side's values share one sample
rate (a judge's rate is set per deployment) and skews the rank test when a side mixes rates.

Error: a uniform sample of ``capacity`` values; a quantile of it is off by ~``sqrt(q(1-q)/capacity)`` in rank
(±0.7 percentile points at the median for 5,000), and the tests' power is that of ``capacity`` samples.
By hand: numpy has no streaming reservoir (a vectorised top-k over keys, a few lines)."""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_CAPACITY = 5_000


class Reservoir:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, seed: int | np.random.SeedSequence = 0) -> None:
        if capacity < 1:
            raise ValueError(f"reservoir capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.rng = np.random.default_rng(seed)
        self.values = np.empty(0, dtype=np.float64)
        self.keys = np.empty(0, dtype=np.float64)
        self.seen = 0            # values offered
        self.weight_sum = 0.0    # their total weight (the population they stand for)

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Offer ``values`` (NaN are skipped) with positive ``weights`` (1 each when None)."""
        values = np.asarray(values, dtype=np.float64)
        w = np.ones(values.size) if weights is None else np.asarray(weights, dtype=np.float64)
        ok = np.isfinite(values) & np.isfinite(w) & (w > 0)
        values, w = values[ok], w[ok]
        if values.size == 0:
            return
        self.seen += values.size
        self.weight_sum += float(w.sum())
        keys = np.log(self.rng.random(values.size)) / w
        self._keep(np.concatenate([self.values, values]), np.concatenate([self.keys, keys]))

    def merge(self, other: Reservoir) -> None:
        self.seen += other.seen
        self.weight_sum += other.weight_sum
        self._keep(np.concatenate([self.values, other.values]), np.concatenate([self.keys, other.keys]))

    def _keep(self, values: np.ndarray, keys: np.ndarray) -> None:
        if values.size > self.capacity:
            top = np.argpartition(keys, values.size - self.capacity)[values.size - self.capacity:]
            values, keys = values[top], keys[top]
        self.values, self.keys = values, keys

    def __len__(self) -> int:
        return int(self.values.size)

    def to_state(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "values": self.values, "keys": self.keys, "seen": self.seen,
                "weight_sum": self.weight_sum, "rng": self.rng.bit_generator.state}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Reservoir:
        r = cls(state["capacity"])
        r.values, r.keys = state["values"], state["keys"]
        r.seen, r.weight_sum = state["seen"], state["weight_sum"]
        r.rng.bit_generator.state = state["rng"]
        return r
