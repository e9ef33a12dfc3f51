"""Incident detection on labelled simulated faults: precision, recall, delay, scope, false incidents per day.

    python -m bench.detection            # the reported run (report seeds, ~400 simulated hours)
    python -m bench.detection --quick    # the same measures on fewer seeds, well under 3 minutes
    python -m bench.detection --tuning   # the tuning seeds (what the parameters were chosen on), not saved

Each fault run (``simulator.scenarios.benchmark_scenarios``) is 12.5 simulated hours of 3 regions x 3 models
x 12 signals in 10 s windows, one labelled fault per 45 min slot, the 7 kinds cycled; clean runs are whole
days of diurnal traffic with no fault. Rows go through ``flink_jobs.detect.replay.run`` (the job's Engine).

A detected incident matches a labelled one when it starts between 2 windows before the fault's start and
6 windows after its end; one detected incident matches at most one fault, and a second incident for the
same fault counts as false. Delay: windows from the fault's ``detectable_at`` to the incident's start
(0 when it came earlier). Scope right: the same ``scope_kind`` and, unless global, the same regions.
Writes precision, recall, delay and the rest into ``bench/results/detection.json`` (other keys kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.results_file import git_commit, merge_results
from infersight.flink_jobs.detect.core import Engine, EngineParams
from infersight.flink_jobs.detect.replay import incidents, run
from infersight.simulator.scenarios import KINDS, WINDOW_S, Scenario, benchmark_scenarios, generate, make_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "detection.json"
REPORT_SEEDS = list(range(1, 31))
QUICK_SEEDS = list(range(1, 11))
TUNING_SEEDS = list(range(1001, 1007))  # parameters were chosen looking at these only
CLEAN_SEEDS = [501, 502, 503]
QUICK_CLEAN_SEEDS = [501]
TUNING_CLEAN_SEEDS = [1501]


def detect(sc: Scenario) -> tuple[list[dict[str, Any]], int, float]:
    rows = generate(sc)
    t = time.perf_counter()
    found = incidents(run(rows, Engine(EngineParams())))
    return found, len(rows), time.perf_counter() - t


def match(sc: Scenario, found: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Per labelled fault: matched incident or None; and the number of false incidents."""
    used: set[int] = set()
    out = []
    for truth in sc.truths():
        hit = None
        for i, inc in enumerate(found):
            if i in used:
                continue
            if truth["start"] - 2 * WINDOW_S <= inc["start"] <= truth["end"] + 6 * WINDOW_S:
                hit = i
                break
        rec: dict[str, Any] = {"truth": truth, "incident": None}
        if hit is not None:
            used.add(hit)
            inc = found[hit]
            rec["incident"] = inc
            rec["delay"] = max(0.0, (inc["start"] - truth["detectable_at"]) / WINDOW_S)
            regions_ok = truth["scope_kind"] == "global" or sorted(inc["regions"]) == sorted(truth["regions"])
            rec["scope_ok"] = inc["scope_kind"] == truth["scope_kind"] and regions_ok
            rec["kind_ok"] = inc["kind"] == truth["expected_kind"]
        out.append(rec)
    return out, len(found) - len(used)


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def evaluate(seeds: list[int], clean_seeds: list[int], verbose: bool = False) -> dict[str, Any]:
    recs: list[dict[str, Any]] = []
    false = 0
    detected = 0
    points = 0
    seconds = 0.0
    hours = 0.0
    for sc in benchmark_scenarios(seeds):
        found, n, dt = detect(sc)
        m, f = match(sc, found)
        recs += m
        false += f
        detected += len(found)
        points += n
        seconds += dt
        hours += sc.hours
        if verbose:
            for r in m:
                if r["incident"] is None or not r["scope_ok"]:
                    tr = r["truth"]
                    print(f"seed {sc.seed}: {tr['kind']} {tr['regions']} at {(tr['start'] - sc.t0) / WINDOW_S:.0f}: "
                          + (r["incident"]["summary"] if r["incident"] else "MISSED"))
    clean_false = 0
    clean_hours = 0.0
    for seed in clean_seeds:
        sc = make_scenario(seed, hours=24.0)
        found, n, dt = detect(sc)
        clean_false += len(found)
        clean_hours += sc.hours
        points += n
        seconds += dt
        if verbose:
            for inc in found:
                print(f"clean seed {seed}: {(inc['start'] - sc.t0) / WINDOW_S:.0f}: {inc['summary']}")
    matched = [r for r in recs if r["incident"] is not None]
    delays = [r["delay"] for r in matched]
    by_kind = {}
    for kind in KINDS:
        rk = [r for r in recs if r["truth"]["kind"] == kind]
        mk = [r for r in rk if r["incident"] is not None]
        dk = [r["delay"] for r in mk]
        by_kind[kind] = {"incidents": len(rk), "recall": len(mk) / len(rk) if rk else None,
                         "delay_windows_median": statistics.median(dk) if dk else None,
                         "delay_windows_p95": pct(dk, 0.95),
                         "scope_accuracy": sum(r["scope_ok"] for r in mk) / len(mk) if mk else None,
                         "kind_accuracy": sum(r["kind_ok"] for r in mk) / len(mk) if mk else None}
    return {
        "precision": round((detected - false) / detected, 4) if detected else None,
        "recall": round(len(matched) / len(recs), 4) if recs else None,
        "delay_windows_median": statistics.median(delays) if delays else None,
        "delay_windows_p95": pct(delays, 0.95),
        "scope_accuracy": round(sum(r["scope_ok"] for r in matched) / len(matched), 4) if matched else None,
        "kind_accuracy": round(sum(r["kind_ok"] for r in matched) / len(matched), 4) if matched else None,
        "false_incidents_per_day": round(clean_false / (clean_hours / 24.0), 3) if clean_hours else None,
        "false_incidents_in_fault_runs": false,
        "simulated_hours": round(hours + clean_hours, 1),
        "fault_hours": round(hours, 1),
        "clean_hours": round(clean_hours, 1),
        "incidents": len(recs),
        "incidents_by_kind": by_kind,
        "points": points,
        "us_per_point": round(seconds / points * 1e6, 2) if points else None,
        "window_s": WINDOW_S,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer seeds (under 3 minutes)")
    ap.add_argument("--tuning", action="store_true", help="run the tuning seeds instead; print, do not save")
    ap.add_argument("--verbose", action="store_true", help="print every miss, wrong scope and false incident")
    args = ap.parse_args(argv)
    t = time.time()
    if args.tuning:
        res = evaluate(TUNING_SEEDS, TUNING_CLEAN_SEEDS, args.verbose)
        print(json.dumps(res, indent=2))
        return 0
    seeds, clean = (QUICK_SEEDS, QUICK_CLEAN_SEEDS) if args.quick else (REPORT_SEEDS, CLEAN_SEEDS)
    res = evaluate(seeds, clean, args.verbose)
    res["seeds"] = seeds
    res["clean_seeds"] = clean
    res["tuning_seeds"] = TUNING_SEEDS
    res["quick"] = bool(args.quick)
    res["wall_s"] = round(time.time() - t, 1)
    res["scenarios_commit"] = git_commit()
    merge_results(RESULTS, res)
    print(json.dumps({k: v for k, v in res.items() if k != "incidents_by_kind"}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
