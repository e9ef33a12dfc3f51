"""Per-request Python cost of the canary and quality jobs' hot paths (issue #17), before and after, on the same
request batches, without the stack.

    python -m bench.job_cost                       # 15 alternating rounds against the branch's merge base with main
    python -m bench.job_cost --baseline <commit> --rounds 5 --seconds 5

Writes bench/results/job_cost.json. What is timed, per Kafka message of ``infersight.requests`` (batches of
``--batch`` normalizer-like records: 3 regions x 2 models, a tenth on the canary track; ``--rate`` requests/s over
``--seconds`` of event time), as the jobs' Python operators run it:

- canary: ``stream.route`` (parse, check, fold, key by region and overall), each key's payload pickled and
  unpickled (what crosses from the route operator to the keyed judge, through Flink's list state) and
  ``CanaryState.feed`` with every key's bake running (the steady state of a rollout).
- quality: its reader (since issue #17's last step, ``stream.read_signals`` of the metrics job's quality signals,
  one message per series and 10 s window made from the same request messages; before, ``stream.read_requests`` of
  every request record: parse, validate, fold labels past the job's default cardinality bound, per (region, model)
  and window partials), each partial pickled and unpickled (``ReadBatches`` -> keyed ``QualityWindows``), ``merge``
  into the pending window, and ``QualityState.close`` of every window at the end (per window, amortised over its
  requests). With the signals, what the metrics job spends on them is reported apart (``metrics_signals_us``:
  binning each batch's groups, the rows crossing to the window, the window's record).

"Before" is the baseline commit's code (``git archive`` into a temporary tree), "after" this tree's, each timed
in its own child process (nice'd) with the same batches; rounds alternate which goes first (the machine's speed
varies, and another process may run), and the medians over rounds are reported, with the median of each
round's before/after ratio (the two ran back to back) and each side's fastest round.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "job_cost.json"
COMPONENTS = ("collectors", "dashboards", "flink_jobs", "instrumentation", "schemas", "simulator", "stack")
NS = 1_000_000_000
WINDOW_S = 10


# ---- the child: time one tree's hot paths ---------------------------------------------------------------

def time_canary(messages: list[bytes]) -> dict[str, float]:
    from infersight.flink_jobs.canary.core import BakeConfig
    from infersight.flink_jobs.canary.stream import DEFAULT_LIMITS, CanaryState, route
    from infersight.flink_jobs.common.cardinality import LabelLimiter

    limiter = LabelLimiter(DEFAULT_LIMITS)
    config = BakeConfig(bake_s=3600.0)  # no final verdict within the run: every bake keeps taking records
    states: dict[str, CanaryState] = {}
    route_s = feed_s = 0.0
    crossing = 0
    for raw in messages:
        t0 = time.perf_counter()
        keyed, _letters = route(raw, limiter, 0)
        payloads = [(key, pickle.dumps(records, protocol=pickle.HIGHEST_PROTOCOL)) for key, records in keyed.items()]
        t1 = time.perf_counter()
        crossing += sum(len(p) for _, p in payloads)
        for key, payload in payloads:
            state = states.get(key)
            if state is None:
                state = states[key] = CanaryState(None, config)
            state.feed(key, pickle.loads(payload))
        feed_s += time.perf_counter() - t1
        route_s += t1 - t0
    return {"route_s": route_s, "feed_s": feed_s, "bakes": sum(s.bake is not None for s in states.values()),
            "bytes": crossing}


def fold_of(limiter: Any) -> Any:
    """The fold ``ReadBatches`` passes for one message (its batch fold where the tree has one)."""
    batch_fold = getattr(limiter, "batch_fold", None)
    return batch_fold(0) if batch_fold is not None else (lambda record: limiter.fold(record, 0))


def quality_signals_of(messages: list[bytes]) -> tuple[list[bytes], float, int]:
    """The metrics job's quality signals (``infersight.quality_signals``) of the request messages, and the Python
    time that job spends on them beyond what it did before: binning each batch's groups (``PreAggregate``), the
    rows crossing to the window (pickled and unpickled once, as the facts are), the window's sum of its groups' rows
    and its JSON record. Parsing, validating and grouping the records are not counted: the metrics job did those
    already. Also the bytes that cross with the groups."""
    from infersight.flink_jobs.common.request_signals import signal_rows
    from infersight.flink_jobs.metrics import core
    from infersight.flink_jobs.metrics.quality_signals import signals_record
    from infersight.flink_jobs.metrics.window_stats import WindowStats

    window_ms = WINDOW_S * 1000
    rows_of: dict[tuple[str, int], list[tuple[int, ...]]] = {}
    spent = 0.0
    crossed = 0
    for raw in messages:
        groups, _late = core.group_batch(core.read_batch(raw.decode(), "requests", []), window_ms, -2**63)
        t0 = time.perf_counter()
        rows = signal_rows(list(groups.values())).tolist()
        for key, row in zip(groups, rows, strict=True):
            payload = pickle.dumps(tuple(row), protocol=pickle.HIGHEST_PROTOCOL)
            crossed += len(payload)
            rows_of.setdefault(key, []).append(pickle.loads(payload))
        spent += time.perf_counter() - t0
    out = []
    t0 = time.perf_counter()
    for (key, end_ms), rows in rows_of.items():
        stats = WindowStats()
        stats.quality_signals = tuple(map(sum, zip(*rows, strict=True)))
        out.append(signals_record(key, end_ms * 1_000_000, stats, window_ms).encode())
    return out, spent + time.perf_counter() - t0, crossed


def time_quality(messages: list[bytes]) -> dict[str, float]:
    """The quality job's path: on a tree with the metrics job's quality signals (``stream.read_signals``), reading
    those (one message per series and window, made from the same request messages, ``quality_signals_of``: its
    own cost reported as the metrics job's); on an older tree, reading every request record (``read_requests``)."""
    from infersight.flink_jobs.common.cardinality import LabelLimiter, limits_of
    from infersight.flink_jobs.quality import stream
    from infersight.flink_jobs.quality.stream import LABELS, QualityState, merge

    read_signals = getattr(stream, "read_signals", None)
    metrics_s, metrics_bytes = 0.0, 0
    if read_signals is None:
        inputs, read = messages, stream.read_requests
    else:
        inputs, metrics_s, metrics_bytes = quality_signals_of(messages)
        read = read_signals
    limiter = LabelLimiter(limits_of("", LABELS), fields=LABELS)  # the job's default bound, as ReadBatches
    pending: dict[tuple[str, int], Any] = {}
    read_s = merge_s = 0.0
    crossed = 0
    for raw in inputs:
        t0 = time.perf_counter()
        partials, _letters = read(raw, WINDOW_S, fold_of(limiter))
        crossing = [pickle.dumps((key, end_ms, n, partial), protocol=pickle.HIGHEST_PROTOCOL)
                    for (key, end_ms), (n, partial) in partials.items()]
        t1 = time.perf_counter()
        crossed += sum(len(p) for p in crossing)
        for payload in crossing:
            key, end_ms, n, partial = pickle.loads(payload)
            waiting_n, waiting = pending.get((key, end_ms)) or (0, None)
            pending[(key, end_ms)] = (waiting_n + n, merge(waiting, partial))
        merge_s += time.perf_counter() - t1
        read_s += t1 - t0
    t2 = time.perf_counter()
    states: dict[str, QualityState] = {}
    for (key, end_ms) in sorted(pending, key=lambda k: (k[1], k[0])):
        state = states.setdefault(key, QualityState())
        state.close(end_ms // 1000, pending[(key, end_ms)][1])
    return {"read_s": read_s, "merge_s": merge_s, "close_s": time.perf_counter() - t2, "windows": len(pending),
            "bytes": crossed, "messages": len(inputs), "input_bytes": sum(len(m) for m in inputs),
            "metrics_s": metrics_s, "metrics_bytes": metrics_bytes}


def child(messages_path: str) -> None:
    with open(messages_path, "rb") as f:
        messages, requests = pickle.load(f)
    time_canary(messages[:5])  # warm-up: imports, first-call caches
    time_quality(messages[:5])
    canary, quality = time_canary(messages), time_quality(messages)
    us = 1e6 / requests
    print(json.dumps({
        "canary_us": (canary["route_s"] + canary["feed_s"]) * us, "canary_route_us": canary["route_s"] * us,
        "canary_feed_us": canary["feed_s"] * us, "canary_bakes": canary["bakes"],
        "canary_bytes_per_request": canary["bytes"] / requests,
        "quality_bytes_per_request": quality["bytes"] / requests,
        "input_bytes_per_request": sum(len(m) for m in messages) / requests,
        "quality_us": (quality["read_s"] + quality["merge_s"] + quality["close_s"]) * us,
        "quality_read_us": quality["read_s"] * us, "quality_merge_us": quality["merge_s"] * us,
        "quality_close_us": quality["close_s"] * us, "quality_windows": quality["windows"],
        "quality_input_messages": quality["messages"],
        "quality_input_bytes_per_request": quality["input_bytes"] / requests,
        # what the metrics job spends on the quality signals (0 on a tree without them)
        "metrics_signals_us": quality["metrics_s"] * us,
        "metrics_signals_bytes_per_request": quality["metrics_bytes"] / requests}))


# ---- the parent: batches, trees, alternating rounds --------------------------------------------------------

def make_messages(seconds: float, rate: int, batch: int, seed: int = 7) -> tuple[list[bytes], int]:
    """``infersight.requests`` messages as the normaliser writes them, in event-time order from a window start."""
    from infersight.schemas.records import dump_batch
    from tests.support.sample_requests import sample_records

    start_ns = 1_800_000_000 * NS  # a window boundary
    span_s = batch / rate
    messages = []
    for k in range(int(seconds * rate) // batch):
        records = sample_records(batch, start_ns + int(k * span_s * NS), span_s, seed=seed + k)
        messages.append(dump_batch([r.to_dict() for r in records]).encode())
    return messages, len(messages) * batch


def baseline_tree(commit: str, into: Path) -> Path:
    """The baseline commit's files (``git archive``) with the package's component links, as the worktrees have."""
    archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for component in COMPONENTS:
        link = into / "infersight" / component
        if not link.exists():
            link.symlink_to(Path("..") / component)
    return into


def run_child(tree: Path, messages_path: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(["nice", "-n", "5", sys.executable, str(Path(__file__).resolve()), "--child",
                          str(messages_path)], cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def resolve(ref: str) -> str:
    return subprocess.run(["git", "rev-parse", ref], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="commit of 'before' (default: merge base with main)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=5.0, help="event time of traffic per round")
    parser.add_argument("--rate", type=int, default=5000, help="requests/s of event time")
    parser.add_argument("--batch", type=int, default=500, help="records per message")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    from bench.results_file import save_results

    baseline = resolve(args.baseline or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=REPO,
                                                       capture_output=True, text=True, check=True).stdout.strip())
    messages, requests = make_messages(args.seconds, args.rate, args.batch)
    load_start = os.getloadavg()[0]  # another process's load inflates both sides; the paired ratio less
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="job_cost_") as tmp:
        messages_path = Path(tmp) / "messages.pickle"
        messages_path.write_bytes(pickle.dumps((messages, requests)))
        (Path(tmp) / "before").mkdir()
        trees = {"before": baseline_tree(baseline, Path(tmp) / "before"), "after": REPO}
        for r in range(args.rounds):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                rounds[name].append(run_child(trees[name], messages_path))
                print(f"round {r + 1} {name}: canary {rounds[name][-1]['canary_us']:.2f} µs/request, "
                      f"quality {rounds[name][-1]['quality_us']:.2f} µs/request", flush=True)
    medians = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in rounds.items()}
    result = {
        "what": "Python CPU per request of the canary and quality jobs' hot paths (pure functions, no stack), "
                "median over alternating rounds; see bench/job_cost.py",
        "requests_per_round": requests, "batch_records": args.batch, "rate_rps": args.rate,
        "seconds": args.seconds, "window_s": WINDOW_S, "rounds": args.rounds,
        "baseline_commit": baseline,
        "us_per_request": {job: {"before": round(medians["before"][f"{job}_us"], 3),
                                 "after": round(medians["after"][f"{job}_us"], 3),
                                 "speedup": round(medians["before"][f"{job}_us"] / medians["after"][f"{job}_us"], 2),
                                 # each round's before/after ran back to back: their ratio cancels slow swings
                                 "speedup_paired_median": round(statistics.median(
                                     b[f"{job}_us"] / a[f"{job}_us"]
                                     for b, a in zip(rounds["before"], rounds["after"], strict=True)), 2),
                                 "fastest_round": {name: round(min(x[f"{job}_us"] for x in rounds[name]), 3)
                                                   for name in ("before", "after")},
                                 "bytes_crossing_per_request": {
                                     name: round(medians[name][f"{job}_bytes_per_request"], 1)
                                     for name in ("before", "after")}}
                           for job in ("canary", "quality")},
        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
        "median": medians, "per_round": rounds,
    }
    save_results(RESULTS, result)
    for job, v in result["us_per_request"].items():
        print(f"{job}: {v['before']:.2f} -> {v['after']:.2f} µs/request ({v['speedup']:.1f}x; paired "
              f"{v['speedup_paired_median']:.1f}x; fastest rounds {v['fastest_round']['before']:.2f} -> "
              f"{v['fastest_round']['after']:.2f}), bytes crossing {v['bytes_crossing_per_request']}")


if __name__ == "__main__":
    main()
