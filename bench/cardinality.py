"""The cardinality attack (issue #20 item 3): a hostile pod sends N requests (default 1,000,000), each with its own
model name, through one regional gateway while the fleet simulator's well-behaved pods run beside it; the metrics
job's bound (``flink_jobs/common/cardinality.py``, the default 1,000 distinct values per label and operator
instance) folds the names past it into ``_OTHER``. Measured: Prometheus's head series before and after the attack,
the distinct ``model`` values on the requests counter, each task manager's peak RSS (process tree, sampled every
2 s), the ``folded_model`` count of the metrics job's ``pre-aggregate`` operator (Flink REST), that every
well-behaved series is exact (lost and double counted per series, each on its own: ``tests/support/pipeline_load.
tally``) and that every hostile request is counted (the admitted names plus ``_OTHER`` == N).

    .venv/bin/python -m bench.cardinality               # 1,000,000 names -> bench/results/cardinality.json
    .venv/bin/python -m bench.cardinality --quick       # 20,000 names, prints the figures, writes no file
    .venv/bin/python -m bench.cardinality --names 200000 --hostile-rps 8000 --results /tmp/card.json

Starts its own stack (fresh, free ports, in a temporary folder), deploys the four jobs as ``bench.throughput`` does
(defaults: no ``--max-label-values``, so 1,000 per label), and stops it and removes the folder at the end. The hostile
sender encodes its requests as the simulator does (``simulator/encode.py``: one pod's resource, the root span of
each request with its own model name, up to 2,000 spans per export) with timelines from the simulator's workload,
paced in real time at ``--hostile-rps`` (so its requests are on time, not late). The well-behaved fleet (tagged
model names, its own ledger) starts first, as pods that were there before the attack: its names hold their
places in the bound while they keep coming.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.results_file import save_results
from bench.stack_bench import tree_rss_kib
from infersight.schemas import otlp_wire as w
from infersight.schemas import pipeline as P
from infersight.schemas.attributes import SCOPE_NAME, SCOPE_VERSION
from infersight.simulator.encode import MAX_SPANS_PER_EXPORT, PodTemplate, root_span
from infersight.simulator.export import Exporter
from infersight.simulator.fleet import DEFAULT_MODELS, DEFAULT_REGIONS, FleetSpec
from infersight.simulator.workload import Fleet, Pod
from tests.support.pipeline_load import (
    counted_per_series,
    fleet,
    keep_event_time_moving,
    sent_per_series,
    settle,
    tally,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "cardinality.json"
REQUESTS = P.prom(P.REQUESTS)
LOOKBACK = "[3h]"  # counters are read at their newest sample (a series goes stale 5 min after its last window)
QUICK_NAMES = 20_000
PRE_AGGREGATE = "pre-aggregate"  # the metrics job's operator that folds request labels (flink_jobs/metrics/job.py)


# ---- the hostile pod ----

def hostile_head(pod: Pod, name: str) -> bytes:
    """The root span's head (name, kind, fixed attributes) as the simulator writes it for a pod, with ``name`` as
    its model (``gen_ai.request.model``, ``chat <name>``)."""
    return PodTemplate(dataclasses.replace(pod, model=dataclasses.replace(pod.model, name=name))).root_head


class HostileSender(threading.Thread):
    """Sends ``names`` requests to one region's gateway, each with the model ``<prefix><i>``, at ``rate`` requests/s
    in real time (each tick's requests end within the tick just passed). ``sent``: requests handed to the
    exporter; ``delivered``: every export acknowledged (after the thread ends)."""

    def __init__(self, endpoint: str, names: int, rate: float, prefix: str, region: str = P.DEFAULT_REGIONS[0],
                 seed: int = 7, tick_s: float = 0.2) -> None:
        super().__init__(daemon=True, name="hostile-pod")
        spec = FleetSpec(rate_rps=rate, regions=tuple(r for r in DEFAULT_REGIONS if r.name == region),
                         models=(dataclasses.replace(DEFAULT_MODELS[0], name=f"{prefix}pod"),), canary_share=0.0,
                         diurnal_amplitude=0.0, sample_ratio=0.0)
        self.workload = Fleet(spec, seed)  # request timelines only: every request goes out as the one pod's
        self.pod = self.workload.pods[0]
        self.resource = PodTemplate(self.pod).resource
        self.scope = w.field(w.SCOPE_SPANS_SCOPE, w.scope(SCOPE_NAME, SCOPE_VERSION))
        self.region, self.names, self.rate, self.prefix, self.tick_s = region, names, rate, prefix, tick_s
        self.exporter = Exporter({region: endpoint})
        self.sent = 0
        self.behind_s = 0.0
        self.delivered: bool | None = None
        self.started_at = self.finished_at = 0.0
        self.stop_event = threading.Event()

    def encode(self, tick, n: int, first: int) -> list[bytes]:
        """The tick's first ``n`` requests as root spans (as ``simulator.encode.Encoder.spans`` writes them), request
        ``i`` with the model ``<prefix><first + i>``; one ExportTraceServiceRequest per 2,000 spans."""
        cols = (tick.end_ns[:n].tolist(), tick.queue_ns[:n].tolist(), tick.prefill_ns[:n].tolist(),
                tick.decode_ns[:n].tolist(), tick.tail_ns[:n].tolist(), tick.tokens_in[:n].tolist(),
                tick.tokens_cached[:n].tolist(), tick.tokens_out[:n].tolist(), tick.gap_ns[:n].tolist(),
                tick.error[:n].tolist())
        tids, sids, span_field = tick.trace_ids, tick.span_ids, w.SCOPE_SPANS_SPAN
        spans = []
        for i, (end, q, p, d, tail, t_in, t_cached, t_out, gaps, err) in enumerate(zip(*cols, strict=True)):
            start = end - (q + p + (d if t_out > 0 else 0) + tail)
            head = hostile_head(self.pod, f"{self.prefix}{first + i}")
            spans.append(w.field(span_field, root_span(head, tids[16 * i:16 * i + 16], sids[8 * i:8 * i + 8], start,
                                                       end, q, p, d, t_in, t_cached, t_out, gaps, err, False)))
        return [w.field(w.REQUEST_RESOURCE_SPANS, self.resource + w.field(
                    w.RESOURCE_SPANS_SCOPE_SPANS, self.scope + b"".join(spans[lo:lo + MAX_SPANS_PER_EXPORT])))
                for lo in range(0, len(spans), MAX_SPANS_PER_EXPORT)]

    def run(self) -> None:
        dt_ns = int(self.tick_s * 1e9)
        t0 = time.time_ns() // dt_ns * dt_ns
        self.started_at = time.monotonic()
        k = 0
        while self.sent < self.names and not self.stop_event.is_set():
            wait = (t0 + (k + 1) * dt_ns - time.time_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)
            self.behind_s = max(self.behind_s, -wait)
            tick = self.workload.tick(k, t0, self.tick_s)
            n = min(len(tick), self.names - self.sent)
            for payload in self.encode(tick, n, self.sent):
                self.exporter.submit(self.region, "traces", payload)
            self.sent += n
            k += 1
        self.finished_at = time.monotonic()
        self.delivered = self.exporter.flush(300)
        self.exporter.close()


# ---- what the stack shows ----

def prom_query(prom_url: str, promql: str) -> list[dict[str, Any]]:
    from infersight.simulator.prom import query

    return query(prom_url, promql, timeout_s=60)


def head_series(prom_url: str) -> int:
    """Series in Prometheus's head block (every series written in the last ~2 h, stale ones included)."""
    with urllib.request.urlopen(f"{prom_url}/api/v1/status/tsdb", timeout=30) as resp:
        return int(json.loads(resp.read())["data"]["headStats"]["numSeries"])


def requests_by_model(prom_url: str, matcher: str = "") -> dict[str, int]:
    """Requests counted per model value (regional counters, each at its newest sample), of the models ``matcher``
    selects (a PromQL label matcher; empty: all)."""
    selector = ",".join(m for m in (matcher, f'{P.LABEL_REGION}!="{P.GLOBAL_REGION}"') if m)
    promql = f"sum by ({P.LABEL_MODEL}) (last_over_time({REQUESTS}{{{selector}}}{LOOKBACK}))"
    return {s["metric"].get(P.LABEL_MODEL, ""): int(float(s["value"][1])) for s in prom_query(prom_url, promql)}


def distinct_models(prom_url: str) -> int:
    result = prom_query(prom_url, f"count(count by ({P.LABEL_MODEL}) (last_over_time({REQUESTS}{LOOKBACK})))")
    return int(float(result[0]["value"][1])) if result else 0


def series_of(prom_url: str, matcher: str) -> int:
    """Series of every metric whose labels match ``matcher``."""
    result = prom_query(prom_url, f"count(last_over_time({{{matcher}}}{LOOKBACK}))")
    return int(float(result[0]["value"][1])) if result else 0


def rest(rest_url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{rest_url}{path}", timeout=10) as resp:
        return json.loads(resp.read())


def operator_vertex(rest_url: str, job_id: str, operator: str = PRE_AGGREGATE) -> dict[str, Any]:
    """The job's vertex (a chain of operators) that holds ``operator``."""
    vertices = rest(rest_url, f"/jobs/{job_id}")["vertices"]
    found = [v for v in vertices if operator in v["name"]]
    if not found:
        raise LookupError(f"no vertex of job {job_id} holds {operator!r}: {[v['name'] for v in vertices]}")
    return found[0]


def folded(rest_url: str, job_id: str, label: str = P.LABEL_MODEL, operator: str = PRE_AGGREGATE) -> int | None:
    """The job's ``folded_<label>`` counter of ``operator``, summed over subtasks (None while not registered). User
    metrics carry their chained operator's name in their id (``...pre-aggregate...folded_model``)."""
    vertex = operator_vertex(rest_url, job_id, operator)
    base = f"/jobs/{job_id}/vertices/{vertex['id']}/subtasks/metrics"
    ids = sorted(m["id"] for m in rest(rest_url, base) if m["id"].endswith(f"folded_{label}"))
    ids = [i for i in ids if operator in i] or ids
    if not ids:
        return None
    values = rest(rest_url, f"{base}?get={urllib.parse.quote(ids[0])}&agg=sum")
    return int(float(values[0]["sum"])) if values else None


class RssSampler(threading.Thread):
    """Peak RSS (MiB, process tree) per component, every ``every_s``."""

    def __init__(self, pids: dict[str, int], every_s: float = 2.0) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.pids, self.every_s = pids, every_s
        self.peak: dict[str, float] = {}
        self.stop_event = threading.Event()

    def sample(self) -> dict[str, float]:
        now = {name: tree_rss_kib(pid) / 1024 for name, pid in self.pids.items()}
        for name, mib in now.items():
            self.peak[name] = max(self.peak.get(name, 0.0), mib)
        return now

    def run(self) -> None:
        while not self.stop_event.wait(self.every_s):
            self.sample()


def wait_counted(prom_url: str, matcher: str, expected: int, timeout_s: float, quiet_s: float = 90.0,
                 log=print) -> int:
    """The requests counted over the models ``matcher`` selects once they reach ``expected``, or stop changing for
    ``quiet_s``, or ``timeout_s``."""
    deadline, last, changed = time.monotonic() + timeout_s, -1, time.monotonic()
    while True:
        n = sum(requests_by_model(prom_url, matcher).values())
        if n == expected:
            return n
        if n != last:
            log(f"[cardinality] hostile requests counted so far: {n:,} of {expected:,}")
            last, changed = n, time.monotonic()
        if time.monotonic() - changed > quiet_s or time.monotonic() > deadline:
            return n
        time.sleep(5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, help="hostile requests, each its own model name (default 1,000,000; "
                                                  f"--quick {QUICK_NAMES:,})")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_NAMES:,} names, no results file unless --results is given")
    parser.add_argument("--hostile-rps", type=float, default=5000.0, help="the hostile pod's requests/s")
    parser.add_argument("--good-rps", type=float, default=300.0, help="the well-behaved fleet's requests/s")
    parser.add_argument("--warm-s", type=float, default=40.0,
                        help="seconds of well-behaved traffic before the attack (its windows reach Prometheus)")
    parser.add_argument("--results", type=Path, help=f"results file (default {RESULTS.relative_to(REPO)}; "
                                                     "with --quick: none)")
    args = parser.parse_args()
    names = args.names or (QUICK_NAMES if args.quick else 1_000_000)
    results = args.results or (None if args.quick else RESULTS)

    from infersight.demo import endpoints_of
    from infersight.flink_jobs.common.cardinality import DEFAULT_MAX_VALUES
    from infersight.simulator.run import Simulator
    from infersight.stack import jobs, setup
    from infersight.stack.ports import PortPlan
    from infersight.stack.supervisor import Stack

    def log(message: str) -> None:
        print(message, flush=True)

    started = time.monotonic()
    setup.ensure_all()
    state = Path(tempfile.mkdtemp(prefix="infersight-cardinality-"))
    stack = Stack(state, PortPlan.free(), log=lambda _: None)
    good_tag = "g" + uuid.uuid4().hex[:5]  # a letter first: no hostile name (digits last) ends in "-<good_tag>"
    prefix = f"hostile-{uuid.uuid4().hex[:6]}-"
    hostile_matcher = f'{P.LABEL_MODEL}=~"{prefix}[0-9]+|{P.OVERFLOW_VALUE}"'
    try:
        stack.up()
        job_ids = jobs.deploy(stack.layout, state / "archive", log=log)
        prom_url, rest_url = stack.layout.prometheus_url, stack.layout.flink_rest_url
        endpoints = endpoints_of(stack)
        tms = {name: pid for name, pid in stack.running_components().items() if name.startswith("flink-taskmanager")}
        others = {name: pid for name, pid in stack.running_components().items() if name == "prometheus"}
        # the well-behaved pods (and a throwaway model keeping event time moving) come first, as in a live fleet
        good = Simulator(fleet(good_tag, args.good_rps), endpoints, seed=5).start()
        keep = keep_event_time_moving(endpoints, good_tag)
        log(f"[cardinality] well-behaved fleet at {args.good_rps:.0f} requests/s, {args.warm_s:.0f} s before the "
            "attack")
        time.sleep(args.warm_s)
        deadline = time.monotonic() + 180
        while not counted_per_series(prom_url, good_tag) and time.monotonic() < deadline:
            time.sleep(3)  # the jobs are up: the fleet's first windows are in Prometheus
        sampler = RssSampler({**tms, **others})
        rss_before = {k: round(v) for k, v in sampler.sample().items()}
        series_before = head_series(prom_url)
        sampler.start()
        log(f"[cardinality] head series before: {series_before:,}; hostile pod: {names:,} names at "
            f"{args.hostile_rps:,.0f} requests/s to {P.DEFAULT_REGIONS[0]}")
        hostile = HostileSender(endpoints[P.DEFAULT_REGIONS[0]], names, args.hostile_rps, prefix)
        hostile.start()
        series_peak = series_before
        while hostile.is_alive():
            hostile.join(10)
            series_peak = max(series_peak, head_series(prom_url))
            log(f"[cardinality] hostile sent {hostile.sent:,} (behind schedule {hostile.behind_s:.1f} s); head "
                f"series {series_peak:,}; task managers "
                + ", ".join(f"{sampler.peak.get(k, 0):.0f}" for k in sorted(tms)) + " MiB peak")
        hostile_s = hostile.finished_at - hostile.started_at
        time.sleep(20)  # the well-behaved pods go on after the attack for a while
        good_delivered = good.stop(flush_s=60)
        log(f"[cardinality] attack over ({hostile_s:.0f} s); settling the well-behaved series")
        counts = settle(prom_url, {good_tag: good.ledger}, timeout_s=300, log=log)[good_tag]
        hostile_counted = wait_counted(prom_url, hostile_matcher, names, timeout_s=300, log=log)
        keep.stop()
        time.sleep(5)
        sampler.stop_event.set()
        sampler.join()
        rss_end = {k: round(v) for k, v in sampler.sample().items()}
        series_after = head_series(prom_url)
        by_model = requests_by_model(prom_url, hostile_matcher)
        admitted = sorted(m for m in by_model if m != P.OVERFLOW_VALUE)
        parallelism = int(operator_vertex(rest_url, job_ids["infersight-metrics"])["parallelism"])
        model_bound = DEFAULT_MAX_VALUES * parallelism + 1  # per subtask, plus _OTHER
        n_models = distinct_models(prom_url)
        hostile_series = series_of(prom_url, f'{P.LABEL_MODEL}=~"{prefix}[0-9]+"')
        folded_model = folded(rest_url, job_ids["infersight-metrics"])
        good_tally = tally(sent_per_series(good.ledger), counted_per_series(prom_url, good_tag))
        if good_tally.to_json() != counts.to_json():
            log(f"[cardinality] the well-behaved tally moved after settling: {counts.to_json()} -> "
                f"{good_tally.to_json()}")
        tm_peak = {k: round(v) for k, v in sampler.peak.items() if k in tms}
    finally:
        stack.down(wipe=True)
        shutil.rmtree(state, ignore_errors=True)  # what wipe leaves: the archive's Parquet files, the folders

    per_model = round(hostile_series / len(admitted), 1) if admitted else None
    problems = [why for why, failed in (
        (f"{good_tally.lost} well-behaved requests lost", good_tally.lost > 0),
        (f"{good_tally.double} well-behaved requests counted twice", good_tally.double > 0),
        (f"hostile requests counted {hostile_counted:,} != sent {names:,}", hostile_counted != names),
        (f"{n_models} distinct models over the bound {model_bound}", n_models > model_bound),
        ("the hostile pod's exports were not all acknowledged", not hostile.delivered),
        ("the well-behaved fleet's exports were not all acknowledged", not good_delivered)) if failed]
    result = {
        "names": names,
        "series_before": series_before,
        "series_after": series_after,
        "series_peak": series_peak,
        "distinct_models": n_models,
        "model_bound": model_bound,
        "max_label_values": DEFAULT_MAX_VALUES,
        "pre_aggregate_parallelism": parallelism,
        "hostile_models_admitted": len(admitted),
        "hostile_series": hostile_series,
        "series_per_admitted_model": per_model,
        "unbounded_series_estimate": round(per_model * names) if per_model else None,
        "overflow_requests": by_model.get(P.OVERFLOW_VALUE, 0),
        "folded_model": folded_model,
        "tm_rss_before_mib": {k: v for k, v in rss_before.items() if k in tms},
        "tm_peak_rss_mib": tm_peak,
        "tm_rss_end_mib": {k: v for k, v in rss_end.items() if k in tms},
        "prometheus_rss_before_mib": rss_before.get("prometheus"),
        "prometheus_peak_rss_mib": round(sampler.peak.get("prometheus", 0.0)),
        "good_sent": good_tally.sent,
        "good_counted": good_tally.counted,
        "good_lost": good_tally.lost,
        "good_double": good_tally.double,
        "good_series_off": good_tally.to_json()["series_off"],
        "good_rps": args.good_rps,
        "hostile_counted": hostile_counted,
        "hostile_rps": args.hostile_rps,
        "hostile_achieved_rps": round(names / hostile_s, 1) if hostile_s > 0 else None,
        "hostile_max_behind_s": round(hostile.behind_s, 2),
        "hostile_s": round(hostile_s, 1),
        "ok": not problems,
        "problems": problems,
        "quick": args.quick,
        "wall_s": round(time.monotonic() - started, 1),
    }
    if results is not None:
        save_results(results, result)
        log(f"[cardinality] wrote {results}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
