"""Window-level fleet model and labelled fault scenarios for the detectors (10 s windows).

Not the request-level simulator (``fleet.py``/``workload.py``): this one draws the window-stats rows the
metrics job would publish (``schemas.detection`` signal names) for 3 regions x a few models with diurnal load,
fast enough to replay days of them. Each scenario carries its ground truth: one labelled incident per fault
(kind, scope, regions, start, end, ``detectable_at``). ``detectable_at`` is the start for abrupt faults; for
the slow latency creep it is the window where the injected slow-down first reaches +15 % (a creep is by
definition invisible at its first window), which is what detection delay is measured from.

Seeded: the same seed gives the same rows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from infersight.schemas.detection import SIGNAL_NAMES

WINDOW_S = 10.0
REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-1")
REGION_SCALE = (1.0, 0.8, 0.6)
REGION_PHASE = (0.0, 0.25, 0.55)  # time-zone shift of each region's daily peak (fraction of a day)
MODELS = ("llama-3.1-8b", "llama-3.1-70b", "mistral-7b")
MODEL_RATE = (300.0, 120.0, 60.0)  # mean requests/s per region at scale 1
MODEL_TTFT = (0.06, 0.18, 0.05)  # median TTFT on an idle pod, s
MODEL_ITL = (0.012, 0.035, 0.010)  # p99 inter-token latency on an idle pod, s
TRACK = "stable"

KINDS = ("regional_outage", "latency_creep", "kv_thrash", "global_push", "error_burst", "traffic_surge",
         "silent_region")
SCOPE_OF_KIND = {"regional_outage": "region", "latency_creep": "model_region", "kv_thrash": "model_region",
                 "global_push": "global", "error_burst": "model_region", "traffic_surge": "region",
                 "silent_region": "region"}
# the incident kind the correlator should name for each scenario kind
DETECTED_KIND = {"regional_outage": "outage", "latency_creep": "latency", "kv_thrash": "cache_thrash",
                 "global_push": "bad_rollout", "error_burst": "errors", "traffic_surge": "traffic_surge",
                 "silent_region": "silent"}


@dataclass
class Fault:
    kind: str
    start: float
    end: float
    region: int = 0
    model: int = 0
    magnitude: float = 1.0
    lags: list[int] = field(default_factory=list)  # global push: windows after start per region
    detectable_at: float = 0.0

    def truth(self) -> dict[str, Any]:
        regions = list(REGIONS) if self.kind == "global_push" else [REGIONS[self.region]]
        models = [MODELS[self.model]] if self.kind in ("latency_creep", "kv_thrash", "error_burst") else list(MODELS)
        return {"kind": self.kind, "scope_kind": SCOPE_OF_KIND[self.kind], "regions": regions, "models": models,
                "start": self.start, "end": self.end, "detectable_at": self.detectable_at,
                "expected_kind": DETECTED_KIND[self.kind]}


@dataclass
class Scenario:
    seed: int
    t0: float
    windows: int
    faults: list[Fault]

    @property
    def hours(self) -> float:
        return self.windows * WINDOW_S / 3600.0

    def truths(self) -> list[dict[str, Any]]:
        return [f.truth() for f in self.faults]

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "t0": self.t0, "windows": self.windows, "faults": [asdict(f) for f in self.faults]}


# minutes a fault lasts, drawn uniformly (any other kind: 5-15)
DURATION_MIN = {"regional_outage": (5, 15), "latency_creep": (20, 30), "kv_thrash": (5, 10), "global_push": (5, 15),
                "error_burst": (3, 10), "traffic_surge": (10, 20)}


def random_fault(kind: str, start: float, rng: np.random.Generator) -> Fault:
    w = WINDOW_S
    region, model = int(rng.integers(len(REGIONS))), int(rng.integers(len(MODELS)))
    low, high = DURATION_MIN.get(kind, (5, 15))
    d = rng.uniform(low, high) * 60
    d = round(d / w) * w
    mag = {"regional_outage": 1.0, "latency_creep": float(rng.uniform(1.0, 2.0)), "kv_thrash": 1.0,
           "global_push": float(rng.uniform(0.03, 0.1)), "error_burst": float(rng.uniform(0.05, 0.25)),
           "traffic_surge": float(rng.uniform(1.8, 2.5)), "silent_region": 1.0}[kind]
    f = Fault(kind, start, start + d, region, model, mag)
    if kind == "global_push":
        f.lags = sorted(int(x) for x in rng.integers(0, 4, size=len(REGIONS)))
        f.lags = [f.lags[i] for i in rng.permutation(len(REGIONS))]
        f.lags[int(np.argmin(f.lags))] = 0
    f.detectable_at = start
    if kind == "latency_creep":  # multiplier 1 + mag * (t - start) / d reaches 1.15
        f.detectable_at = start + math.ceil(0.15 / mag * d / w) * w
    return f


def make_scenario(seed: int, hours: float = 12.0, kinds: list[str] | None = None, slot_min: float = 45.0,
                  warmup_min: float = 30.0) -> Scenario:
    """A run of ``hours`` with one fault per ``slot_min`` slot (the kinds given, in order; none: clean)."""
    rng = np.random.default_rng(seed)
    t0 = 1_767_225_600.0 + float(rng.integers(0, 8640)) * WINDOW_S  # a random time of day
    windows = int(hours * 3600 / WINDOW_S)
    faults = []
    slot = slot_min * 60
    for i, kind in enumerate(kinds or []):
        start = t0 + warmup_min * 60 + i * slot + round(rng.uniform(3, 5) * 6) * WINDOW_S
        f = random_fault(kind, start, rng)
        if f.end + 600 > t0 + windows * WINDOW_S:
            break
        faults.append(f)
    return Scenario(seed, t0, windows, faults)


def generate(sc: Scenario) -> list[tuple[float, str, str, str, str, float]]:
    """The window-stats rows of a scenario, in window order: (window_end, region, model, track, signal, value)."""
    rng = np.random.default_rng(sc.seed + 1_000_003)
    W, R, M = sc.windows, len(REGIONS), len(MODELS)
    t = sc.t0 + WINDOW_S * np.arange(1, W + 1)
    rate_mult = np.ones((W, R, M))
    err = np.full((W, R, M), 0.002)
    ttft_mult = np.ones((W, R, M))
    kv_pin = np.zeros((W, R, M), dtype=bool)
    present = np.ones((W, R, M), dtype=bool)
    new_track: list[tuple[int, int, int, int, str]] = []  # (from window, to window, region, model, track)
    for n, f in enumerate(sc.faults):
        a = int(round((f.start - sc.t0) / WINDOW_S)) - 1
        b = int(round((f.end - sc.t0) / WINDOW_S)) - 1
        if f.kind == "regional_outage":
            rate_mult[a:b, f.region, :] *= 0.05
            err[a:b, f.region, :] = 0.5
            others = [r for r in range(R) if r != f.region]
            share = REGION_SCALE[f.region] / sum(REGION_SCALE[r] for r in others)
            for r in others:
                rate_mult[a:b, r, :] *= 1 + share
        elif f.kind == "latency_creep":
            ramp = 1 + f.magnitude * (np.arange(b - a) + 1) / (b - a)
            ttft_mult[a:b, f.region, f.model] *= ramp
        elif f.kind == "kv_thrash":
            kv_pin[a:b, f.region, f.model] = True
            ttft_mult[a:b, f.region, f.model] *= 2.0
        elif f.kind == "global_push":
            for r in range(R):
                ar = a + f.lags[r]
                err[ar:b, r, :] = f.magnitude
                ttft_mult[ar:b, r, :] *= 1.5
                new_track.append((max(0, ar - 2), b, r, 0, f"push-{sc.seed}-{n}"))
        elif f.kind == "error_burst":
            err[a:b, f.region, f.model] = f.magnitude
        elif f.kind == "traffic_surge":
            rate_mult[a:b, f.region, :] *= f.magnitude
        elif f.kind == "silent_region":
            present[a:b, f.region, :] = False
    phase = np.array(REGION_PHASE)
    diurnal = 1 + 0.35 * np.sin(2 * np.pi * (t[:, None] / 86_400.0 + phase[None, :]))  # (W, R)
    base = np.array(REGION_SCALE)[:, None] * np.array(MODEL_RATE)[None, :]  # (R, M)
    capacity = base * 1.35 / 0.7
    mean_rate = base[None] * diurnal[:, :, None] * rate_mult
    count = rng.poisson(mean_rate * WINDOW_S)
    rate = count / WINDOW_S
    util = np.minimum(mean_rate / capacity[None], 1.2)
    load = 1 + 0.6 * util ** 2 + (np.maximum(0.0, util - 0.85) * 10) ** 2

    def ln(sigma: float) -> np.ndarray:
        return np.exp(rng.normal(0.0, sigma, size=(W, R, M)))

    errors = rng.binomial(count, np.clip(err, 0, 1))
    err_ratio = errors / np.maximum(count, 1)
    ttft50 = np.array(MODEL_TTFT)[None, None, :] * load * ttft_mult * ln(0.02)
    ttft99 = ttft50 * 3.0 * ln(0.04)
    itl99 = np.array(MODEL_ITL)[None, None, :] * (1 + 0.3 * util) * ln(0.03)
    e2e99 = (ttft99 + itl99 * 200) * ln(0.03)
    queue = 20 * util ** 4 / (1 - np.minimum(util, 0.97)) * ln(0.1)
    kv = np.clip(0.15 + 0.6 * util + rng.normal(0, 0.01, size=(W, R, M)), 0, 1)
    kv = np.where(kv_pin, np.clip(0.97 + rng.normal(0, 0.005, size=(W, R, M)), 0, 1), kv)
    prefix = np.clip(0.6 + rng.normal(0, 0.015, size=(W, R, M)), 0, 1)
    prefix = np.where(kv_pin, np.clip(0.1 + rng.normal(0, 0.02, size=(W, R, M)), 0, 1), prefix)
    batch = 48 * util * ln(0.03)
    gpu = np.clip(0.2 + 0.75 * util + rng.normal(0, 0.01, size=(W, R, M)), 0, 1)
    tokens = rate * 180 * ln(0.02)
    values = {"request_rate": rate, "error_ratio": err_ratio, "ttft_p50": ttft50, "ttft_p99": ttft99,
              "itl_p99": itl99, "e2e_p99": e2e99, "queue_depth": queue, "kv_cache_usage": kv,
              "prefix_cache_hit_ratio": prefix, "batch_size": batch, "gpu_utilization": gpu, "tokens_per_s": tokens}
    stack = np.stack([values[s] for s in SIGNAL_NAMES], axis=-1)  # (W, R, M, S)
    rows: list[tuple[float, str, str, str, str, float]] = []
    tl = t.tolist()
    for w in range(W):
        tw = tl[w]
        block = stack[w].tolist()
        for r in range(R):
            for m in range(M):
                if not present[w, r, m]:
                    continue
                vals = block[r][m]
                for s, name in enumerate(SIGNAL_NAMES):
                    rows.append((tw, REGIONS[r], MODELS[m], TRACK, name, vals[s]))
        for a, b, r, m, track in new_track:
            if a <= w < b and present[w, r, m]:
                vals = block[r][m]
                for s, name in enumerate(SIGNAL_NAMES):
                    rows.append((tw, REGIONS[r], MODELS[m], track, name, vals[s] * (0.1 if s in (0, 11) else 1.0)))
    return rows


def benchmark_scenarios(seeds: list[int], hours: float = 12.0, slot_min: float = 45.0) -> list[Scenario]:
    """Fault runs: the kinds cycled in a seeded shuffled order so every kind appears about equally."""
    out = []
    per = int((hours * 60 - 30 - 15) // slot_min)
    for seed in seeds:
        rng = np.random.default_rng(seed * 7919 + 17)
        kinds = [KINDS[(seed + i) % len(KINDS)] for i in range(per)]
        kinds = [kinds[i] for i in rng.permutation(len(kinds))]
        out.append(make_scenario(seed, hours, kinds, slot_min))
    return out
