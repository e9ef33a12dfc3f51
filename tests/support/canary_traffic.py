"""Request records of one model's stable and canary tracks drawn by the simulator's fleet model (its latency and
error model and its ``canary_regression`` perturbation), as ``infersight.requests`` records: for feeding the
canary job on the real stack without the collectors in between."""

from __future__ import annotations

from typing import Any

import numpy as np

from infersight.simulator.fleet import DEFAULT_MODELS, DEFAULT_REGIONS, FleetSpec, Perturbation
from infersight.simulator.workload import ALL_ERRORS, Fleet

NS = 1_000_000_000


def canary_records(model: str, start_ns: int, seconds: int, rate_rps: float = 200.0, canary_share: float = 0.2,
                   regression: float | None = 1.5, seed: int = 1) -> list[list[dict[str, Any]]]:
    """One batch of records per simulated second from ``start_ns``; ``regression``: the canary's latencies x this
    and +5 % errors (the simulator's ``canary_regression``), None for an identical canary."""
    base = DEFAULT_MODELS[0]
    spec_model = type(base)(**{**base.__dict__, "name": model})
    perturbations = (() if regression is None
                     else (Perturbation("canary_regression", 0.0, 1e9, regression, track="canary"),))
    fleet = Fleet(FleetSpec(rate_rps=rate_rps, regions=DEFAULT_REGIONS[:1], models=(spec_model,),
                            canary_share=canary_share, diurnal_amplitude=0.0, perturbations=perturbations), seed)
    batches = []
    for k in range(seconds):
        tick = fleet.tick(k, start_ns, 1.0)
        batch = []
        for i in range(len(tick)):
            pod = fleet.pods[int(tick.pod[i])]
            out = int(tick.tokens_out[i])
            err = int(tick.error[i])
            batch.append({
                "trace_id": tick.trace_ids[16 * i:16 * i + 16].hex(), "region": pod.region.name, "model": model,
                "model_version": pod.version, "track": pod.track, "start_ns": int(tick.start_ns[i]),
                "end_ns": int(tick.end_ns[i]), "e2e_s": float(tick.e2e_ns[i]) / NS,
                "ttft_s": float(tick.queue_ns[i] + tick.prefill_ns[i]) / NS if out > 0 else None,
                "decode_s": float(tick.decode_ns[i]) / NS if out > 1 else None,
                "itl_p50_s": float(tick.gap_ns[i, 0]) / NS if out > 1 else None,
                "tokens_out": out, "error_type": ALL_ERRORS[err] if err >= 0 else None,
            })
        batches.append(batch)
    return batches


def batch_end_ns(batch: list[dict[str, Any]]) -> int:
    return int(np.max([r["end_ns"] for r in batch]))
