"""The detector's single-series core on the Numenta Anomaly Benchmark, scored by NAB's own scorer.

    python -m bench.nab --nab-dir /path/to/NAB            # a checkout of github.com/numenta/NAB (never committed)
    python -m bench.nab --nab-dir /path/to/NAB --tune     # the odd-file parameter search (prints, saves nothing)

Each data file is run point by point through ``flink_jobs.detect.core.Detector`` with ``NAB_PARAMS`` (fixed
here; no look-ahead: it never sees a file's minimum, maximum or length; time is the file's own timestamps).
The results go out in NAB's layout (``<out>/infersight/<category>/infersight_<file>.csv`` with timestamp, value,
anomaly_score, label) and are scored with NAB's ``optimizeThreshold`` / ``scoreCorpus`` (its Sweeper, its
profiles, its 15 % probation), normalised as NAB's ``run.py --normalize`` does (null detector 0, perfect 100;
the null detector's score is minus the profile's false-negative weight per labelled window).

Scores written (merged into ``bench/results/detection.json``, other keys kept):
``nab_standard``, ``nab_reward_low_fp``, ``nab_reward_low_fn`` — the whole corpus, thresholds optimised by NAB on
the whole corpus (what NAB's run.py does for every published detector); ``nab_aws_standard`` — the
realAWSCloudwatch files, same threshold; ``nab_standard_even_files`` — the even-numbered files (sorted relative
paths, counted from 1) with the threshold NAB's optimiser chose on the odd-numbered files. Parameters were
chosen on the odd-numbered files only (``--tune``).

The anomaly score is in [0, 1] (``scores_for``): the Detector's z through ``core.Likelihood`` (how unusual the
recent |z| is against the series' own long-run |z|, with 100 points of rest after a likelihood of 0.999).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.results_file import git_commit, save_results
from infersight.flink_jobs.detect.core import Detector, DetectorParams, Likelihood, LikelihoodParams

RESULTS = Path(__file__).resolve().parent / "results" / "detection.json"
NAME = "infersight"
NAB_LIKELIHOOD = LikelihoodParams(short_alpha=0.3, long_alpha=0.003, gate=0.999, rest=100)
NAB_PARAMS = DetectorParams(
    warmup=200, alpha=0.02, beta=0.0, spread_alpha=0.003, huber=5.0, threshold=8.0, confirm_threshold=5.0,
    clear=2.0, clear_windows=60, max_episode=200, floor_abs=1e-6, floor_rel=0.005, direction="both",
    gap_reset_s=30 * 86_400.0, season_after_s=86_400.0, season_bins=288, season_alpha=0.5)


def scores_for(values: list[tuple[float, float]], p: DetectorParams, lp: LikelihoodParams | None = None
               ) -> list[float]:
    """NAB anomaly scores in [0, 1]: the Detector's z through the Likelihood stage; 0 during the warm-up."""
    lp = lp or NAB_LIKELIHOOD
    d, lik = Detector(), Likelihood()
    out = []
    for t, x in values:
        z, _ = d.update(t, x, p)
        out.append(lik.update(z, lp) if d.n > p.warmup else 0.0)
    return out


def read_series(path: Path) -> tuple[list[str], list[tuple[float, float]]]:
    stamps, values = [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            stamps.append(row["timestamp"])
            t = dt.datetime.strptime(row["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
            values.append((t, float(row["value"])))
    return stamps, values


def data_files(nab: Path) -> list[str]:
    data = nab / "data"
    return sorted(str(p.relative_to(data)) for p in data.rglob("*.csv"))


def write_results(nab: Path, out: Path, p: DetectorParams, files: list[str]) -> tuple[int, float]:
    points, seconds = 0, 0.0
    for rel in files:
        stamps, values = read_series(nab / "data" / rel)
        t = time.perf_counter()
        scores = scores_for(values, p)
        seconds += time.perf_counter() - t
        points += len(values)
        cat, name = os.path.split(rel)
        target = out / NAME / cat / f"{NAME}_{name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["timestamp", "value", "anomaly_score", "label"])
            for s, (_, v), sc in zip(stamps, values, scores, strict=True):
                w.writerow([s, repr(v), f"{sc:.6f}", 0])
    return points, seconds


class SerialPool:
    """What NAB's scoreCorpus needs of a multiprocessing pool, in this process (the machine is shared)."""

    class _Done:
        def __init__(self, value: Any) -> None:
            self.value = value

        def get(self, timeout: float | None = None) -> Any:
            return self.value

    def map_async(self, func: Any, args: list[Any]) -> _Done:
        return self._Done([func(a) for a in args])


class NabScorer:
    def __init__(self, nab: Path, results: Path) -> None:
        sys.path.insert(0, str(nab))
        from nab.corpus import Corpus
        from nab.labeler import CorpusLabel

        self.nab, self.results = nab, results
        self.Corpus = Corpus
        self.label = CorpusLabel(path=str(nab / "labels" / "combined_windows.json"), corpus=Corpus(str(nab / "data")))
        self.profiles = json.loads((nab / "config" / "profiles.json").read_text())

    def corpus(self, files: list[str]) -> Any:
        c = self.Corpus(str(self.results / NAME))
        keep = {os.path.join(os.path.dirname(f), f"{NAME}_{os.path.basename(f)}") for f in files}
        c.dataFiles = {k: v for k, v in c.dataFiles.items() if k in keep}
        return c

    def threshold(self, files: list[str], profile: str) -> float:
        from nab.optimizer import optimizeThreshold

        cost = self.profiles[profile]["CostMatrix"]
        return optimizeThreshold((NAME, cost, self.corpus(files), self.label, 0.15))["threshold"]

    def normalized(self, files: list[str], profile: str, threshold: float) -> float:
        from nab.scorer import scoreCorpus

        cost = self.profiles[profile]["CostMatrix"]
        df = scoreCorpus(threshold, (SerialPool(), NAME, profile, cost, str(self.results / NAME), self.corpus(files),
                                     self.label, 0.15, False))
        total = float(df["Score"].iloc[-1])
        n_windows = sum(len(self.label.windows[f]) for f in files)
        null = -cost["fnWeight"] * n_windows
        perfect = cost["tpWeight"] * n_windows
        return 100.0 * (total - null) / (perfect - null)


def evaluate(nab: Path, out: Path, p: DetectorParams, tune: bool = False) -> dict[str, Any]:
    files = data_files(nab)
    odd = [f for i, f in enumerate(files, 1) if i % 2 == 1]
    even = [f for i, f in enumerate(files, 1) if i % 2 == 0]
    points, seconds = write_results(nab, out, p, odd if tune else files)
    scorer = NabScorer(nab, out)
    if tune:
        th = scorer.threshold(odd, "standard")
        return {"nab_standard_odd_files": round(scorer.normalized(odd, "standard", th), 2), "threshold": th}
    res: dict[str, Any] = {}
    for profile, key in (("standard", "nab_standard"), ("reward_low_FP_rate", "nab_reward_low_fp"),
                         ("reward_low_FN_rate", "nab_reward_low_fn")):
        th = scorer.threshold(files, profile)
        res[key] = round(scorer.normalized(files, profile, th), 2)
        res[key + "_threshold"] = th
        if profile == "standard":
            aws = [f for f in files if f.startswith("realAWSCloudwatch/")]
            res["nab_aws_standard"] = round(scorer.normalized(aws, profile, th), 2)
    th_odd = scorer.threshold(odd, "standard")
    res["nab_standard_odd_files"] = round(scorer.normalized(odd, "standard", th_odd), 2)
    res["nab_standard_even_files"] = round(scorer.normalized(even, "standard", th_odd), 2)
    res["nab_files"] = len(files)
    res["nab_points"] = points
    res["nab_us_per_point"] = round(seconds / points * 1e6, 2)
    res["nab_params"] = {k: v for k, v in vars(p).items()}
    return res


# one-change-at-a-time neighbours of NAB_PARAMS, scored on the odd-numbered files (--tune). The search that led
# to NAB_PARAMS went this way on odd files only: the fleet defaults 18.6; clear_windows 60, warm-up 200,
# threshold 12/8: 40.4; threshold 8/5: 42.6; alpha 0.02: 47.2; spread_alpha 0.003: 50.5 (onset-based scores);
# then the Likelihood stage: 26.7 without rest, rest 100: 39.2, short_alpha 0.3: 53.7, long_alpha 0.003: 53.7;
# then a 5-minute time-of-day profile (288 bins, smoothing 0.5, after a day): 56.2; huber 5: 56.9.
TUNING_GRID: list[dict[str, Any]] = [
    {}, {"threshold": 7.0}, {"threshold": 10.0, "confirm_threshold": 6.0}, {"alpha": 0.01}, {"alpha": 0.05},
    {"spread_alpha": 0.001}, {"warmup": 400}, {"huber": 3.0}, {"season_alpha": 0.3}, {"season_alpha": 0.8},
    {"season_bins": 2016, "season_period_s": 7 * 86_400.0, "season_after_s": 7 * 86_400.0},
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nab-dir", required=True, type=Path, help="a checkout of numenta/NAB")
    ap.add_argument("--out", type=Path, default=Path("/tmp/infersight-nab-results"),
                    help="where NAB's results layout is written (outside the repository)")
    ap.add_argument("--tune", action="store_true", help="score the tuning grid on the odd-numbered files only")
    args = ap.parse_args(argv)
    if args.tune:
        for change in TUNING_GRID:
            p = replace(NAB_PARAMS, **change)
            print(json.dumps({"change": change, **evaluate(args.nab_dir, args.out, p, tune=True)}), flush=True)
        return 0
    t = time.time()
    res = evaluate(args.nab_dir, args.out, NAB_PARAMS)
    res["nab_wall_s"] = round(time.time() - t, 1)
    res["nab_commit"] = git_commit()
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for k in ("machine", "commit", "measured_at", "command"):
        previous.pop(k, None)
    previous.update(res)
    save_results(RESULTS, previous)
    print(json.dumps({k: v for k, v in res.items() if k != "nab_params"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
