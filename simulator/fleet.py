"""What the simulated fleet is: regions, models (stable and canary versions), pods, load shape, and
fault timelines. Plain frozen dataclasses so a scenario is data, loadable from JSON."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from infersight.schemas import pipeline as P
from infersight.schemas.attributes import TRACKS


@dataclass(frozen=True)
class ModelSpec:
    name: str
    stable_version: str
    canary_version: str
    share: float                  # of the fleet's requests
    prefill_median_s: float       # prefill of a median prompt on an idle pod
    itl_median_s: float           # median gap between output tokens
    output_tokens_scale: float    # Pareto scale of output lengths (heavy tail)
    input_tokens_median: float
    prefix_hit_ratio: float       # mean share of prompt tokens served from the prefix cache
    gpus_per_pod: int = 1
    capacity_rps: float = 40.0    # requests/s one pod holds before queueing dominates


@dataclass(frozen=True)
class RegionSpec:
    name: str
    weight: float                 # share of traffic
    latency_factor: float = 1.0   # hardware / network differences
    gpu_type: str = "h100"
    utc_offset_h: float = 0.0     # shifts the diurnal curve


@dataclass(frozen=True)
class Perturbation:
    """One fault on the timeline: from ``at_s`` for ``duration_s`` seconds of simulated time.

    kinds: ``slow`` (latencies x magnitude, utilisation and so queueing up with them), ``slow_prefill``
    (prefill time x magnitude, nothing else: a pure TTFT shift, e.g. a prompt-processing regression; the
    pod's service rate and queueing are left as they are), ``errors`` (error rate +magnitude), ``pod_down``
    (a pod's requests fail fast and its gauges stop), ``canary_regression`` (the canary's latencies x
    magnitude and error rate +5 %), and on the judged share (``FleetSpec.judge_rate``): ``quality_drop``
    (the relevance score's mean -magnitude and refusals +magnitude: a silent failure, latency unchanged),
    ``guardrail_surge`` (PII flags +magnitude); ``prompt_shift`` (prompt lengths x magnitude: a shift of the
    traffic's mix). ``region``/``model``/``track``/``pod`` narrow it; empty means all."""

    kind: str
    at_s: float
    duration_s: float
    magnitude: float = 2.0
    region: str = ""
    model: str = ""
    track: str = ""
    pod: int = -1

    KINDS = ("slow", "slow_prefill", "errors", "pod_down", "canary_regression", "quality_drop", "guardrail_surge",
             "prompt_shift")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"perturbation kind {self.kind!r} is not one of {self.KINDS}")
        if self.track and self.track not in TRACKS:
            raise ValueError(f"perturbation track {self.track!r} is not one of {TRACKS}")

    def active(self, t_s: float) -> bool:
        return self.at_s <= t_s < self.at_s + self.duration_s

    def hits(self, region: str, model: str, track: str, pod: int) -> bool:
        return ((not self.region or self.region == region) and (not self.model or self.model == model)
                and (not self.track or self.track == track) and (self.pod < 0 or self.pod == pod))


_US, _EU, _AP = P.DEFAULT_REGIONS
DEFAULT_REGIONS = (
    RegionSpec(_US, 0.45, 1.0, "h100", -5.0),
    RegionSpec(_EU, 0.35, 1.1, "h100", 0.0),
    RegionSpec(_AP, 0.20, 1.25, "a100", 8.0),
)
DEFAULT_MODELS = (
    ModelSpec("llama-3.1-8b-instruct", "2024-07-23", "2024-12-06", 0.55, 0.025, 0.012, 60.0, 700.0, 0.35,
              gpus_per_pod=1, capacity_rps=60.0),
    ModelSpec("mistral-small-24b", "2501", "2503", 0.30, 0.045, 0.022, 80.0, 900.0, 0.25,
              gpus_per_pod=2, capacity_rps=30.0),
    ModelSpec("qwen2.5-72b-instruct", "v1.0", "v1.1", 0.15, 0.090, 0.035, 120.0, 1500.0, 0.45,
              gpus_per_pod=4, capacity_rps=12.0),
)


@dataclass(frozen=True)
class FleetSpec:
    rate_rps: float = 1000.0          # mean requests/s over the whole fleet (before the diurnal curve)
    regions: tuple[RegionSpec, ...] = DEFAULT_REGIONS
    models: tuple[ModelSpec, ...] = DEFAULT_MODELS
    canary_share: float = 0.1         # of each model's traffic, on its canary pods
    target_utilisation: float = 0.6   # pods per group are sized so the mean load sits here
    diurnal_amplitude: float = 0.3    # +-30 % over a simulated day
    day_s: float = 86_400.0           # length of the simulated day in seconds (shorten for demos)
    error_rate: float = 0.01
    timeout_rate: float = 0.002
    sample_ratio: float = 0.01        # traces kept whole (stage spans); the rest send record-only roots
    gauge_interval_s: float = 5.0
    judge_rate: float = 0.0           # share of requests judged beside serving (relevance, refusal, PII results)
    perturbations: tuple[Perturbation, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.rate_rps <= 0:
            raise ValueError(f"rate_rps must be > 0, got {self.rate_rps}")
        if not self.regions or not self.models:
            raise ValueError("a fleet needs at least one region and one model")
        if not 0.0 <= self.judge_rate <= 1.0:
            raise ValueError(f"judge_rate must be in [0, 1], got {self.judge_rate}")

    def pods(self, model: ModelSpec, region: RegionSpec, track: str) -> int:
        """Pods serving ``model`` on ``track`` in ``region``: enough for the mean load at the target
        utilisation, at least one."""
        share = self.canary_share if track == "canary" else 1.0 - self.canary_share
        mean_rps = self.rate_rps * region.weight / self._weight_sum() * model.share / self._share_sum() * share
        return max(1, math.ceil(mean_rps / (model.capacity_rps * self.target_utilisation)))

    def _weight_sum(self) -> float:
        return sum(r.weight for r in self.regions)

    def _share_sum(self) -> float:
        return sum(m.share for m in self.models)

    def diurnal(self, t_s: float, region: RegionSpec) -> float:
        """Load multiplier at simulated time ``t_s`` (peak mid-afternoon local time)."""
        local = (t_s / self.day_s + region.utc_offset_h / 24.0) % 1.0
        return 1.0 + self.diurnal_amplitude * math.sin(2 * math.pi * (local - 0.375))

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> FleetSpec:
        """A scenario file: any FleetSpec field; regions/models/perturbations as lists of objects."""
        raw = json.loads(Path(path).read_text())
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"{path}: unknown fleet fields {sorted(unknown)}")
        for key, kind in (("regions", RegionSpec), ("models", ModelSpec), ("perturbations", Perturbation)):
            if key in raw:
                raw[key] = tuple(kind(**item) for item in raw[key])
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**raw)
