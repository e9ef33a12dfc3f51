"""Whole-pipeline throughput: the fleet simulator ramps offered load through the real pipeline (3 regional
gateways, Kafka, every job of stack/jobs.py (or those of ``--jobs``) on Flink, the sink collector, Prometheus;
1 % of the requests judged, as in production, for the quality job) and, for each step, records the load held
with zero loss, freshness (request end -> its window's metric queryable in Prometheus) p50/p99, CPU and memory
per component, and the first bottleneck.

    .venv/bin/python -m bench.throughput              # full: steps of 5 min until one is not held
    .venv/bin/python -m bench.throughput --quick      # 2 steps of 60 s (< 5 min with the stack's start)
    .venv/bin/python -m bench.throughput --steps 1000,2000,4000 --step-s 120
    .venv/bin/python -m bench.throughput --steps 10000 --jobs infersight-normalize,infersight-metrics,\
        infersight-archive,infersight-detect,infersight-quality --results bench/results/throughput_quality.json

Starts its own stack (fresh, free ports, in a temporary folder) and stops it at the end. Writes
bench/results/throughput.json and bench/results/throughput.png. Each step's fleet has its own model
names, so its requests are counted apart: a step is *held* when every request the simulator's ledger
counted is in Prometheus exactly once, the simulator kept its schedule, and freshness p99 stayed
at or under --max-freshness-s (default 20 s, the goal's bar). Lost and double-counted requests are summed
per series (region, model, version, track), each on its own (``tests/support/pipeline_load.tally``): a
loss in one series and a double count in another do not cancel.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from bench.jobs_bench import CLK_TCK, tree_ticks
from bench.results_file import save_results
from bench.stack_bench import tree_rss_kib
from tests.support.pipeline_load import (
    WindowWatcher,
    counted_per_series,
    fleet,
    keep_event_time_moving,
    late_per_region,
    sent_per_series,
    settle,
    tally,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "throughput.json"
WINDOW_MS = 10_000


def rss_mib(pid: int) -> float:
    return tree_rss_kib(pid) / 1024


def window_lags(seen: dict[int, float], ends: set[int]) -> list[list[float]]:
    """[window end (epoch s), seconds from window end to its first appearance] for the given windows: shows
    whether freshness is steady or spikes (a periodic stall, a restart)."""
    return [[end / 1000, round(seen[end] - end / 1000, 2)] for end in sorted(ends) if end in seen]


def freshness(ledger, seen: dict[int, float]) -> tuple[float | None, float | None, int]:
    """p50/p99 over requests of (its window's first appearance - its end), from the ledger's per-second
    counts (a request is taken to end mid-second); and how many requests' windows never appeared."""
    lags, weights, missing = [], [], 0
    for second, n in ledger.by_second.items():
        end = (second * 1000 // WINDOW_MS + 1) * WINDOW_MS
        if end not in seen:
            missing += n
            continue
        lags.append(seen[end] - (second + 0.5))
        weights.append(n)
    if not lags:
        return None, None, missing
    order = np.argsort(lags)
    lag, cum = np.array(lags)[order], np.cumsum(np.array(weights)[order])
    q = lambda p: float(lag[np.searchsorted(cum, p * cum[-1])])  # noqa: E731
    return round(q(0.5), 2), round(q(0.99), 2), missing


def own_cpu_s() -> float:
    """CPU seconds of this process's threads only (the stack's processes are its children)."""
    t = os.times()
    return t.user + t.system


def cpu_sample(pids: dict[str, int]) -> dict[str, tuple[int, float]]:
    return {name: (tree_ticks(pid), rss_mib(pid)) for name, pid in pids.items()}


def busy_cores(rest_url: str) -> dict[str, dict[str, float]]:
    """Per running Flink job and vertex (a chain of operators), the cores its tasks keep busy: busyTimeMsPerSecond
    summed over the vertex's subtasks (Flink's own measure; in thread mode it includes the Python work). Task
    managers host several jobs, so this is how one job's share (the detect job's) is told apart from the process CPU
    above, and which of its operators spends it."""
    def get(path: str) -> Any:
        with urllib.request.urlopen(f"{rest_url}{path}", timeout=5) as resp:
            return json.loads(resp.read())

    out: dict[str, dict[str, float]] = {}
    try:
        for job in get("/jobs/overview")["jobs"]:
            if job["state"] != "RUNNING":
                continue
            vertices = out.setdefault(job["name"], {})
            for v in get(f"/jobs/{job['jid']}")["vertices"]:
                for m in get(f"/jobs/{job['jid']}/vertices/{v['id']}/subtasks/metrics"
                             "?get=busyTimeMsPerSecond&agg=sum"):
                    value = float(m.get("sum", "nan"))
                    if math.isfinite(value):
                        vertices[v["name"]] = vertices.get(v["name"], 0.0) + value / 1000
    except (OSError, ValueError, KeyError):
        pass  # a sample missed: the mean is over the others
    return out


def run_step(stack, watcher: WindowWatcher, rate: float, step_s: float, pids: dict[str, int],
             judge_rate: float = 0.0) -> dict[str, Any]:
    from infersight.demo import endpoints_of
    from infersight.simulator.run import Simulator

    tag = uuid.uuid4().hex[:6]
    watcher.watch(tag)
    spec = dataclasses.replace(fleet(tag, rate), judge_rate=judge_rate)
    late_before = sum(late_per_region(stack.layout.prometheus_url).values())
    sim = Simulator(spec, endpoints_of(stack), seed=int(rate)).start()
    before, sim_before, t0 = cpu_sample(pids), own_cpu_s(), time.monotonic()
    peak_rss: dict[str, float] = {}
    busy: dict[str, list[float]] = {}
    behind = 0.0
    while time.monotonic() - t0 < step_s:
        time.sleep(2.0)
        behind = max(behind, sim.behind_s)
        for name, (_, rss) in cpu_sample(pids).items():
            peak_rss[name] = max(peak_rss.get(name, 0.0), rss)
        for name, vertices in busy_cores(stack.layout.flink_rest_url).items():
            busy.setdefault(name, []).append(vertices)
    after, sim_after, wall = cpu_sample(pids), own_cpu_s(), time.monotonic() - t0
    delivered = sim.stop(flush_s=60)
    cpu = {name: round((after[name][0] - before[name][0]) / CLK_TCK / wall, 3) for name in pids}
    cpu["simulator+bench"] = round((sim_after - sim_before) / wall, 3)
    return {"tag": tag, "offered_rps": rate, "ledger": sim.ledger, "wall_s": wall, "delivered": delivered,
            "late_before": late_before,
            "achieved_rps": round(sim.ledger.total / wall, 1), "max_behind_s": round(behind, 2),
            "cpu_cores": cpu, "peak_rss_mib": {k: round(v) for k, v in peak_rss.items()},
            "job_busy_cores": {k: round(float(np.mean([sum(s.values()) for s in v])), 4) for k, v in busy.items()},
            "vertex_busy_cores": {k: {name: round(float(np.mean([s.get(name, 0.0) for s in v])), 4)
                                      for name in sorted({n for s in v for n in s})} for k, v in busy.items()}}


def bottleneck(step: dict[str, Any], cores: int) -> str:
    if step["max_behind_s"] > 2.0:
        return "simulator (could not offer the load on schedule)"
    top = max(step["cpu_cores"].items(), key=lambda kv: kv[1])
    busy = sum(step["cpu_cores"].values())
    if busy > 0.9 * cores:
        return f"CPU: the machine's {cores} cores are busy ({busy:.2f}); largest share {top[0]} ({top[1]:.2f})"
    return f"largest CPU share {top[0]} ({top[1]:.2f} cores)"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    x = [r["offered_rps"] for r in rows]
    ax.plot(x, [r["counted_rps"] for r in rows], "o-", label="counted requests/s (in Prometheus)")
    ax.plot(x, x, ":", color="grey", label="offered")
    ax.set_xlabel("offered requests/s")
    ax.set_ylabel("requests/s")
    ax2 = ax.twinx()
    ax2.plot(x, [r["freshness_p99_s"] or float("nan") for r in rows], "s--", color="tab:red",
             label="freshness p99 (s)")
    ax2.plot(x, [r["freshness_p50_s"] or float("nan") for r in rows], "^--", color="tab:orange",
             label="freshness p50 (s)")
    ax2.set_ylabel("seconds from request end to Prometheus")
    ax2.set_ylim(bottom=0)
    for r in rows:
        if not r["held"]:
            ax.annotate("not held", (r["offered_rps"], r["counted_rps"]), textcoords="offset points", xytext=(0, 8))
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [ln.get_label() for ln in lines], loc="upper left", fontsize=8)
    ax.set_title("infersight whole pipeline on one machine: throughput vs freshness")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two steps of 60 s")
    parser.add_argument("--steps", help="offered requests/s per step, comma-separated")
    parser.add_argument("--step-s", type=float, help="seconds per step (default 300; quick 60)")
    parser.add_argument("--max-freshness-s", type=float, default=20.0,
                        help="a step is held only if freshness p99 stays at or under this (the issue: 20 s)")
    parser.add_argument("--all-steps", action="store_true", help="do not stop at the first step not held")
    parser.add_argument("--judge-rate", type=float, default=0.01,
                        help="share of requests with evaluation results (judged beside serving), which the quality "
                             "job reads besides every request (default %(default)s)")
    parser.add_argument("--topology", choices=["single", "multi-region"], default="single",
                        help="the stack's topology (as `infersight up --topology`)")
    parser.add_argument("--jobs", help="the jobs to run, comma-separated (default: all of stack.jobs.JOBS), e.g. "
                                       "the pipeline with the quality job but not the canary job")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help=f"results file (default {RESULTS.relative_to(REPO)}; its plot beside it as .png)")
    args = parser.parse_args()
    steps = [float(s) for s in (args.steps or ("1000,2000" if args.quick else "1000,2000,3000,4000,6000,8000,10000"))
             .split(",")]
    step_s = args.step_s or (60.0 if args.quick else 300.0)

    from infersight.demo import endpoints_of
    from infersight.simulator.run import Simulator
    from infersight.stack import jobs, setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    names = args.jobs.split(",") if args.jobs else list(jobs.JOBS)
    unknown = sorted(set(names) - set(jobs.JOBS))
    if unknown:
        parser.error(f"unknown jobs {unknown}; the jobs are {', '.join(jobs.JOBS)}")
    started = time.monotonic()
    setup.ensure_all()
    state = Path(tempfile.mkdtemp(prefix="infersight-throughput-"))
    stack = Stack(state, PortPlan.free(topology=args.topology), log=lambda _: None)
    rows: list[dict[str, Any]] = []
    try:
        stack.up()
        jobs.deploy(stack.layout, state / "archive", log=lambda m: print(m, flush=True), only=names)
        pids = stack.running_components()
        watcher = WindowWatcher(stack.layout.prometheus_url)
        watcher.start()
        # a little traffic first so the jobs are warm and windows flow before the first step counts
        warm = Simulator(fleet("warm" + uuid.uuid4().hex[:4], 100), endpoints_of(stack), seed=1).start()
        time.sleep(20)
        warm.stop()
        done: list[dict[str, Any]] = []
        for rate in steps:
            print(f"[throughput] step {rate:,.0f} requests/s for {step_s:.0f} s", flush=True)
            step = run_step(stack, watcher, rate, step_s, pids, args.judge_rate)
            done.append(step)
            # other traffic closes this step's windows; judge the step once they are in
            keep = keep_event_time_moving(endpoints_of(stack), step["tag"])
            settle(stack.layout.prometheus_url, {step["tag"]: step["ledger"]}, timeout_s=max(120.0, step_s))
            last_window = (step["ledger"].last_end_ns // 1_000_000 // WINDOW_MS + 1) * WINDOW_MS
            wait_seen = time.monotonic() + 30
            while last_window not in watcher.first_seen(step["tag"]) and time.monotonic() < wait_seen:
                time.sleep(1)
            keep.stop()
            row = judge(stack.layout.prometheus_url, watcher, step, args.max_freshness_s)
            rows.append(row)
            brief = {k: v for k, v in row.items() if k not in ("cpu_cores", "window_lag_s")}
            print(f"[throughput] {json.dumps(brief)}", flush=True)
            if not row["held"] and not args.all_steps:
                break
        watcher.stop_event.set()
    finally:
        stack.down(wipe=True)
    held = [r for r in rows if r["held"]]
    best = max(held, key=lambda r: r["offered_rps"]) if held else None
    first_not_held = next((r for r in rows if not r["held"]), None)
    result = {
        "sustained_rps": best["counted_rps"] if best else 0.0,
        "sustained_offered_rps": best["offered_rps"] if best else 0.0,
        "sustained_minutes": round(best["wall_s"] / 60, 2) if best else 0.0,
        "lost_requests": best["lost_requests"] if best else None,
        "double_counted_requests": best["double_counted_requests"] if best else None,
        "freshness_p50_s": best["freshness_p50_s"] if best else None,
        "freshness_p99_s": best["freshness_p99_s"] if best else None,
        "first_bottleneck": first_not_held["bottleneck"] if first_not_held else (rows[-1]["bottleneck"] if rows
                                                                                  else None),
        "steps": rows,
        "quick": args.quick,
        "judge_rate": args.judge_rate,
        "jobs": names,  # the quality job reads the metrics job's quality signals and the judged results
        "topology": args.topology,
        "wall_s": round(time.monotonic() - started, 1),
    }
    save_results(args.results, result)
    if rows:
        plot(rows, args.results.with_suffix(".png"))
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=2))


def judge(prom_url: str, watcher: WindowWatcher, step: dict[str, Any], max_freshness_s: float) -> dict[str, Any]:
    ledger = step["ledger"]
    seen = watcher.first_seen(step["tag"])
    counts = tally(sent_per_series(ledger), counted_per_series(prom_url, step["tag"]))
    n, lost, double = counts.counted, counts.lost, counts.double
    p50, p99, missing = freshness(ledger, seen)
    not_held = [why for why, failed in (
        (f"{lost} requests lost", lost > 0), (f"{double} requests counted twice", double > 0),
        ("the simulator could not deliver its exports", not step["delivered"]),
        (f"the simulator fell {step['max_behind_s']} s behind schedule", step["max_behind_s"] > 2.0),
        (f"freshness p99 {p99} s over {max_freshness_s} s", p99 is None or p99 > max_freshness_s)) if failed]
    held = not not_held
    row = {"offered_rps": step["offered_rps"], "achieved_rps": step["achieved_rps"],
           "counted_rps": round(n / step["wall_s"], 1), "sent": ledger.total, "counted": n, "lost_requests": lost,
           "double_counted_requests": double, "freshness_p50_s": p50, "freshness_p99_s": p99,
           "requests_in_windows_never_seen": missing,
           # records that missed their window (counted in the totals, not the window's gauges): at a steady load
           # none should; any means a partition went idle while it still had records (a watermark jumped it)
           "late_records": sum(late_per_region(prom_url).values()) - step["late_before"],
           "wall_s": round(step["wall_s"], 1),
           "max_behind_s": step["max_behind_s"], "held": held, "not_held_because": not_held,
           "cpu_cores": step["cpu_cores"], "peak_rss_mib": step["peak_rss_mib"],
           "job_busy_cores": step["job_busy_cores"], "vertex_busy_cores": step["vertex_busy_cores"],
           "series_off": counts.to_json()["series_off"],
           "window_lag_s": window_lags(seen,
                                       {(sec * 1000 // WINDOW_MS + 1) * WINDOW_MS for sec in ledger.by_second})}
    row["bottleneck"] = bottleneck(step, os.cpu_count() or 2)
    return row


if __name__ == "__main__":
    main()
