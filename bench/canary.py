"""Canary verdicts on the simulator's traffic: A/A false-fail rate, and power and time to a ``fail`` verdict per
regression, beside the naive rule teams use today (canary p99 TTFT > stable p99 TTFT x 1.1) on the same data.

    python -m bench.canary            # the reported run: 200 A/A bakes, 60 per regression
    python -m bench.canary --quick    # the same measures on fewer bakes, under 3 minutes

Each bake: one model (the simulator's llama-3.1-8b-instruct) in one region at 1,000 requests/s, 10 % of it on
the canary, 10 simulated minutes drawn by ``simulator.workload.Fleet`` (its latency/error model) in 30 s ticks;
``flink_jobs.canary.core.Bake`` looks after every tick (20 looks). Regressions are the simulator's own
perturbations on the canary track: ``ttft_10pct`` / ``ttft_20pct`` are ``slow_prefill`` x1.135 / x1.27 (the
prefill alone, calibrated so the canary's median TTFT is +10 % / +20 %: queue waits, unchanged, dilute a
prefill change), ``slow_10pct`` / ``slow_20pct`` are ``slow`` x1.1 / x1.2 (every latency of the canary, and
its queueing with them: the median TTFT moves by +23 % / +53 %), and ``errors`` +0.01 / +0.02. Quality: the
simulator has no answer quality, so 1 % of requests are judged with a Beta score of mean 0.80 and s.d. 0.15
(canary mean 0.76 in ``quality_0.04``), weighted 1 / 0.01.

Power: the share of bakes whose verdict is ``fail`` by the bake's end; seconds to verdict: the look at which
it became ``fail``. The naive rule is checked at the same looks on every request since the bake's start.

Two scenarios where blame must be placed right:

- ``one_region``: two regions at 1,000 requests/s each, the canary x1.2 slower in the second only; a bake per
  region and one over both (what the job runs). The regressed region's verdict should be ``fail``, the
  healthy region's not.
- ``shared_slowdown``: an identical canary, and both tracks of the region x1.5 slower from minute 2 to 6 of
  the bake (a shared cause: a noisy neighbour, a network incident). Comparing within the same region and time,
  the canary must not be blamed: its false-fail rate, beside the naive rule's.
Timings do not matter here (simulated time); the figures are statistical, with the bakes' count beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from bench.results_file import save_results
from infersight.flink_jobs.canary.core import Bake, BakeConfig
from infersight.simulator.fleet import DEFAULT_MODELS, DEFAULT_REGIONS, FleetSpec, Perturbation
from infersight.simulator.workload import Fleet, Tick

RESULTS = Path(__file__).resolve().parent / "results" / "canary.json"
RATE_RPS, CANARY_SHARE, BAKE_S, TICK_S = 1000.0, 0.1, 600.0, 30.0
JUDGED, QUALITY_MEAN, QUALITY_SD = 0.01, 0.80, 0.15
NAIVE_FACTOR = 1.1
EARLY_S = 180.0
FOREVER_S = 1e9


def _canary(kind: str, magnitude: float) -> Perturbation:
    return Perturbation(kind, 0.0, FOREVER_S, magnitude, track="canary")


# name -> (simulator perturbations on the canary, quality drop of the canary)
REGRESSIONS: dict[str, tuple[tuple[Perturbation, ...], float]] = {
    "ttft_10pct": ((_canary("slow_prefill", 1.135),), 0.0),
    "ttft_20pct": ((_canary("slow_prefill", 1.27),), 0.0),
    "slow_10pct": ((_canary("slow", 1.1),), 0.0),
    "slow_20pct": ((_canary("slow", 1.2),), 0.0),
    "errors_1pp": ((_canary("errors", 0.01),), 0.0),
    "errors_2pp": ((_canary("errors", 0.02),), 0.0),
    "quality_0.04": ((), 0.04),
}
CRITICAL = ("ttft_20pct", "errors_2pp")  # the "clearly worse" ones that must fail within EARLY_S
SHARED_SLOWDOWN = (Perturbation("slow", 120.0, 240.0, 1.5),)  # both tracks, mid-bake
REGIONAL_MAGNITUDE = 1.2  # one_region: the canary's slowdown in the regressed region


# pods are sized to this utilisation: 27 stable and 3 canary pods at 33.3 requests/s each, so an identical canary
# is loaded (and queues) exactly as stable does (at the default 0.6 its 3 pods ran at 56 % against stable's 60 %,
# 8 % faster: no A/A for latency)
UTILISATION = 0.5556


def fleet_spec(perturbations: tuple[Perturbation, ...], regions: int = 1) -> FleetSpec:
    """One model at RATE_RPS per region (regions weighted equally)."""
    chosen = tuple(dataclasses.replace(r, weight=1.0) for r in DEFAULT_REGIONS[:regions])
    spec = FleetSpec(rate_rps=RATE_RPS * regions, regions=chosen, models=DEFAULT_MODELS[:1],
                     canary_share=CANARY_SHARE, diurnal_amplitude=0.0, target_utilisation=UTILISATION,
                     perturbations=perturbations)
    model = spec.models[0]
    for region in spec.regions:
        per_pod = [RATE_RPS * share / spec.pods(model, region, track)
                   for track, share in (("stable", 1 - CANARY_SHARE), ("canary", CANARY_SHARE))]
        if abs(per_pod[0] - per_pod[1]) > 1e-6:
            raise ValueError(f"stable and canary pods would carry different loads: {per_pod} requests/s")
    return spec


def quality_scores(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    """Beta scores in [0, 1] with ``mean`` and s.d. QUALITY_SD."""
    total = mean * (1 - mean) / QUALITY_SD ** 2 - 1
    return rng.beta(mean * total, (1 - mean) * total, n)


def tick_values(tick: Tick, canary_pod: np.ndarray, keep: np.ndarray | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Per side, each metric's values of one tick (what ``metrics.DEFAULT_METRICS`` extracts from records);
    ``keep``: only these requests (one region's)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    is_canary = canary_pod[tick.pod]
    tokens, errored = tick.tokens_out, tick.error >= 0
    everything = np.ones(len(tokens), dtype=bool) if keep is None else keep
    for side, mask in (("canary", is_canary & everything), ("stable", ~is_canary & everything)):
        has_token = mask & (tokens > 0)
        many = mask & (tokens > 1)
        out[side] = {
            "ttft_s": (tick.queue_ns[has_token] + tick.prefill_ns[has_token]) / 1e9,
            "e2e_s": tick.e2e_ns[mask] / 1e9,
            "itl_s": tick.gap_ns[many, 0] / 1e9,
            "tpot_s": tick.decode_ns[many] / (tokens[many] - 1) / 1e9,
            "error_ratio": errored[mask].astype(np.float64),
            "output_tokens": tokens[mask & ~errored & (tokens > 0)].astype(np.float64),
        }
    return out


def run_bake(seed: int, perturbations: tuple[Perturbation, ...], quality_drop: float) -> dict[str, Any]:
    fleet = Fleet(fleet_spec(perturbations), seed=seed)
    canary_pod = np.array([p.track == "canary" for p in fleet.pods])
    rng = np.random.default_rng([seed, 7])
    model, region = fleet.spec.models[0], fleet.spec.regions[0]
    bake = Bake(model.name, region.name, 0, BakeConfig(bake_s=BAKE_S, interval_s=TICK_S))
    version = {"canary": model.canary_version, "stable": model.stable_version}
    ttft: dict[str, list[np.ndarray]] = {"canary": [], "stable": []}
    verdict: dict[str, Any] = {}
    fail_s = naive_s = None
    for k in range(int(BAKE_S / TICK_S)):
        tick = fleet.tick(k, 0, TICK_S)
        values = tick_values(tick, canary_pod)
        for side, metrics in values.items():
            bake.saw(side, version[side], region.name, int(tick.end_ns[-1]), int(tick.end_ns[0]),
                     len(metrics["error_ratio"]))
            for name, v in metrics.items():
                bake.add_values(side, name, v)
            judged = rng.random(len(metrics["e2e_s"])) < JUDGED
            mean = QUALITY_MEAN - (quality_drop if side == "canary" else 0.0)
            bake.add_values(side, "quality_score", quality_scores(rng, int(judged.sum()), mean),
                            np.full(int(judged.sum()), 1 / JUDGED))
            ttft[side].append(metrics["ttft_s"])
        now_s = (k + 1) * TICK_S
        if bake.final is None:
            verdict = bake.evaluate(int(now_s * 1e9))
            if verdict["verdict"] == "fail":
                fail_s = now_s
        if naive_s is None:
            p99 = {side: np.percentile(np.concatenate(parts), 99) for side, parts in ttft.items()}
            if p99["canary"] > p99["stable"] * NAIVE_FACTOR:
                naive_s = now_s
    failed = [m["metric"] for m in verdict["metrics"] if m["status"] == "fail"]
    all_ttft = {side: np.concatenate(parts) for side, parts in ttft.items()}
    return {"verdict": verdict["verdict"], "fail_s": fail_s, "naive_s": naive_s, "failed_metrics": failed,
            "reasons": verdict["reasons"],
            # what the perturbation did to TTFT in the simulator's model (queueing amplifies a slowdown)
            "ttft_median_ratio": float(np.median(all_ttft["canary"]) / np.median(all_ttft["stable"])),
            "ttft_p99_ratio": float(np.percentile(all_ttft["canary"], 99) / np.percentile(all_ttft["stable"], 99))}


def run_regional_bake(seed: int) -> dict[str, Any]:
    """``one_region``: a bake per region and one over both, the canary slower in the second region only."""
    names = [r.name for r in DEFAULT_REGIONS[:2]]
    regressed = names[1]
    fleet = Fleet(fleet_spec((Perturbation("slow", 0.0, FOREVER_S, REGIONAL_MAGNITUDE, region=regressed,
                                           track="canary"),), regions=2), seed=seed)
    canary_pod = np.array([p.track == "canary" for p in fleet.pods])
    region_of = np.array([p.region.name for p in fleet.pods])
    model = fleet.spec.models[0]
    config = BakeConfig(bake_s=BAKE_S, interval_s=TICK_S)
    bakes = {r: Bake(model.name, r, 0, config) for r in (*names, "")}  # "": over every region
    version = {"canary": model.canary_version, "stable": model.stable_version}
    verdicts: dict[str, dict[str, Any]] = {}
    fail_s: dict[str, float | None] = dict.fromkeys(bakes)
    for k in range(int(BAKE_S / TICK_S)):
        tick = fleet.tick(k, 0, TICK_S)
        for region in names:
            values = tick_values(tick, canary_pod, region_of[tick.pod] == region)
            for bake in (bakes[region], bakes[""]):
                for side, metrics in values.items():
                    bake.saw(side, version[side], region, int(tick.end_ns[-1]), int(tick.end_ns[0]),
                             len(metrics["error_ratio"]))
                    for name, v in metrics.items():
                        bake.add_values(side, name, v)
        now_s = (k + 1) * TICK_S
        for key, bake in bakes.items():
            if bake.final is None:
                verdicts[key] = bake.evaluate(int(now_s * 1e9))
                if verdicts[key]["verdict"] == "fail":
                    fail_s[key] = now_s
    return {"regressed": verdicts[regressed]["verdict"], "regressed_fail_s": fail_s[regressed],
            "healthy": verdicts[names[0]]["verdict"], "overall": verdicts[""]["verdict"],
            "overall_fail_s": fail_s[""]}


def summarise_regional(bakes: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(bakes)
    times = [b["regressed_fail_s"] for b in bakes if b["regressed_fail_s"] is not None]
    healthy_fails = sum(b["healthy"] == "fail" for b in bakes)
    rate, upper = rate_with_bound(healthy_fails, n)
    return {"bakes": n, "canary_slowdown_in_regressed_region": REGIONAL_MAGNITUDE,
            "regressed_region_power": len(times) / n, "regressed_region_power_lower95": lower_bound(len(times), n),
            "regressed_region_seconds_to_verdict_median": statistics.median(times) if times else None,
            "healthy_region_false_fail_rate": rate, "healthy_region_false_fail_upper95": upper,
            "overall_power": sum(b["overall"] == "fail" for b in bakes) / n,
            "verdicts": {side: dict(Counter(b[side] for b in bakes)) for side in ("regressed", "healthy", "overall")}}


def _run(job: Job) -> dict[str, Any]:
    return run_regional_bake(job) if isinstance(job, int) else run_bake(*job)


Job = tuple[int, tuple[Perturbation, ...], float] | int  # (seed, perturbations, quality drop), or a one_region seed


def run_bakes(jobs: list[Job], workers: int) -> list[dict[str, Any]]:
    if workers <= 1:
        return [_run(job) for job in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_run, jobs, chunksize=4))


def rate_with_bound(hits: int, n: int) -> tuple[float, float]:
    """The rate and its one-sided 95 % Clopper–Pearson upper bound."""
    upper = float(stats.beta.ppf(0.95, hits + 1, n - hits)) if hits < n else 1.0
    return hits / n, upper


def lower_bound(hits: int, n: int) -> float:
    """One-sided 95 % Clopper–Pearson lower bound of a rate."""
    return float(stats.beta.ppf(0.05, hits, n - hits + 1)) if hits > 0 else 0.0


def summarise(bakes: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(bakes)
    times = [b["fail_s"] for b in bakes if b["fail_s"] is not None]
    naive = [b["naive_s"] for b in bakes if b["naive_s"] is not None]
    return {
        "bakes": n, "power": len(times) / n, "power_lower95": lower_bound(len(times), n),
        "seconds_to_verdict_median": statistics.median(times) if times else None,
        "seconds_to_verdict_p90": float(np.percentile(times, 90)) if times else None,
        "fails_within_180s": sum(t <= EARLY_S for t in times) / n,
        "verdicts": dict(Counter(b["verdict"] for b in bakes)),
        "failed_metrics": dict(Counter(m for b in bakes for m in b["failed_metrics"])),
        "ttft_median_ratio": statistics.median(b["ttft_median_ratio"] for b in bakes),
        "ttft_p99_ratio": statistics.median(b["ttft_p99_ratio"] for b in bakes),
        "naive_power": len(naive) / n,
        "naive_seconds_to_verdict_median": statistics.median(naive) if naive else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 A/A bakes and 8 per regression (< 3 min)")
    parser.add_argument("--workers", type=int, default=2, help="processes drawing and judging bakes")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    aa_n, reg_n = (20, 8) if args.quick else (200, 60)
    started = time.perf_counter()
    aa = run_bakes([(seed, (), 0.0) for seed in range(1, aa_n + 1)], args.workers)
    fails = sum(b["verdict"] == "fail" for b in aa)
    naive_fails = sum(b["naive_s"] is not None for b in aa)
    rate, upper = rate_with_bound(fails, aa_n)
    naive_rate, naive_upper = rate_with_bound(naive_fails, aa_n)
    result: dict[str, Any] = {
        "aa_bakes": aa_n, "aa_false_fail_rate": rate, "aa_false_fail_upper95": upper,
        "aa_verdicts": dict(Counter(b["verdict"] for b in aa)),
        "aa_reasons": dict(Counter(r for b in aa for r in b["reasons"] if b["verdict"] != "pass")),
        "naive_aa_false_fail_rate": naive_rate, "naive_aa_false_fail_upper95": naive_upper,
    }
    for i, (name, (perturbations, drop)) in enumerate(REGRESSIONS.items()):
        seeds = range(10_000 * (i + 1), 10_000 * (i + 1) + reg_n)
        result[name] = summarise(run_bakes([(seed, perturbations, drop) for seed in seeds], args.workers))
        print(name, {k: result[name][k] for k in ("power", "seconds_to_verdict_median", "naive_power")}, flush=True)
    shared = run_bakes([(seed, SHARED_SLOWDOWN, 0.0) for seed in range(90_000, 90_000 + reg_n)], args.workers)
    shared_rate, shared_upper = rate_with_bound(sum(b["verdict"] == "fail" for b in shared), reg_n)
    result["shared_slowdown"] = {
        "bakes": reg_n, "slowdown": "both tracks x1.5 from 120 s to 360 s of the bake",
        "false_fail_rate": shared_rate, "false_fail_upper95": shared_upper,
        "verdicts": dict(Counter(b["verdict"] for b in shared)),
        "naive_false_fail_rate": sum(b["naive_s"] is not None for b in shared) / reg_n}
    print("shared_slowdown", {k: result["shared_slowdown"][k] for k in ("false_fail_rate", "naive_false_fail_rate")},
          flush=True)
    result["one_region"] = summarise_regional(run_bakes(list(range(80_000, 80_000 + reg_n)), args.workers))
    print("one_region", {k: result["one_region"][k] for k in ("regressed_region_power",
                                                              "healthy_region_false_fail_rate")}, flush=True)
    result["goals"] = {
        "aa_false_fail_rate_le_0.01": rate <= 0.01,
        "power_ge_0.95": {k: result[k]["power"] >= 0.95 for k in ("ttft_10pct", "errors_1pp", "quality_0.04")},
        "critical_fail_within_180s": {k: result[k]["seconds_to_verdict_median"] is not None
                                      and result[k]["seconds_to_verdict_median"] <= EARLY_S for k in CRITICAL},
    }
    result["settings"] = {
        "quick": args.quick, "rate_rps": RATE_RPS, "canary_share": CANARY_SHARE, "bake_s": BAKE_S,
        "look_every_s": TICK_S, "workers": args.workers, "alpha": BakeConfig().alpha,
        "reservoir_per_side": BakeConfig().reservoir,
        "quality_judged": JUDGED, "quality_mean": QUALITY_MEAN, "quality_sd": QUALITY_SD,
        "naive_rule": f"canary p99 TTFT > stable p99 TTFT x {NAIVE_FACTOR}, at every look, since the bake's start",
        "correction": "Bonferroni over metrics with data x Lan-DeMets O'Brien-Fleming alpha spending over looks",
    }
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print({k: result[k] for k in ("aa_bakes", "aa_false_fail_rate", "naive_aa_false_fail_rate", "goals", "wall_s")})
    if not args.no_save:
        save_results(RESULTS, result)


if __name__ == "__main__":
    main()
