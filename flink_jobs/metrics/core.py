"""The metrics job's pure core: grouping batches by series (or deployment) and window, what each window result
becomes as OTLP metrics, pod gauge roll-ups and cost per deployment, region and everywhere. The Flink wiring
is in ``job``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infersight.flink_jobs.common.deadletter import dead_letter, json_of
from infersight.flink_jobs.common.keys import (
    deployment_key,
    deployment_labels,
    deployment_rollups,
    labels_of,
    series_key,
)
from infersight.flink_jobs.common.windows import fired, window_end_of_ns
from infersight.flink_jobs.metrics.otlp_metrics import MetricsBatch
from infersight.flink_jobs.metrics.window_stats import Cumulative, WindowStats
from infersight.schemas import metrics as M
from infersight.schemas import pipeline as P
from infersight.schemas.records import INT64_MAX, gauge_problems, parse_batch, record_problems
from infersight.schemas.units import MS as MS_NS

JOB = "infersight-metrics"


def group_batch(records: list[Any], window_ms: int, watermark_ms: int,
                rejected: list[tuple[Any, list[str]]] | None = None,
                fold: Callable[[dict[str, Any]], dict[str, Any]] | None = None, catchup_ms: int = 0
                ) -> tuple[dict[tuple[str, int], list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    """One batch of records -> ``{(series key, window end ms): records}`` and the late ones per series:
    those whose window has already fired at this watermark (Flink's rule: window end - 1 <= watermark), or,
    with ``catchup_ms``, those whose window ended more than that before the watermark (a window behind the
    watermark but within the bound is grouped: a catch-up window, ``functions.WindowGroups``).
    Late records stay grouped too: a backlog arriving late must not become one element (and one metrics
    message) per request. An item that breaks the contract (``record_problems``) is never grouped: it goes
    to ``rejected`` as ``(item, problems)`` (the job dead-letters it). ``fold`` (a ``LabelLimiter``'s) may
    replace a valid record's labels past their cardinality bound by ``_OTHER`` before it is keyed."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    late: dict[str, list[dict[str, Any]]] = {}
    late_after = watermark_ms - catchup_ms
    for record in records:
        problems = record_problems(record)
        if problems:
            if rejected is not None:
                rejected.append((record, problems))
            continue
        if fold is not None:
            record = fold(record)
        end = window_end_of_ns(record["end_ns"], window_ms)
        if fired(end, late_after):
            late.setdefault(series_key(record), []).append(record)
            continue
        key = (series_key(record), end)
        group = groups.get(key)
        if group is None:
            groups[key] = [record]
        else:
            group.append(record)
    return groups, late


def group_gauges(gauges: list[Any], window_ms: int, watermark_ms: int,
                 rejected: list[tuple[Any, list[str]]] | None = None,
                 fold: Callable[[dict[str, Any]], dict[str, Any]] | None = None, catchup_ms: int = 0
                 ) -> tuple[dict[tuple[str, int], list[dict[str, Any]]], int]:
    """One batch of pod gauge points -> ``{(deployment key, window end ms): points}``, each point under its
    deployment and that deployment's roll-ups (``keys.deployment_rollups``: its region, everywhere,
    everything), and how many points were late (their window already fired at this watermark, or ended more
    than ``catchup_ms`` before it with a catch-up bound, as ``group_batch``: dropped, as a Flink window drops
    late elements). A point that breaks the contract (``gauge_problems``: not an object,
    a NaN value, a time past int64...) goes to ``rejected`` as ``(item, problems)`` instead."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    late = 0
    for gauge in gauges:
        problems = gauge_problems(gauge, P.POD_GAUGE_STATS)
        if not problems and window_end_of_ns(gauge["time_ns"], window_ms) * MS_NS > INT64_MAX:
            problems = [f"time_ns: {gauge['time_ns']} puts its window's end past int64"]
        if problems:
            if rejected is not None:
                rejected.append((gauge, problems))
            continue
        if fold is not None:
            gauge = fold(gauge)
        end = window_end_of_ns(gauge["time_ns"], window_ms)
        if fired(end, watermark_ms - catchup_ms):
            late += 1
            continue
        for key in deployment_rollups(deployment_key(gauge)):
            groups.setdefault((key, end), []).append(gauge)
    return groups, late


def read_batch(value: str | bytes, topic: str, rejected: list[str]) -> list[Any]:
    """The items of one ``infersight.requests`` or ``infersight.pods`` message; a message that is not a JSON
    array (or object) becomes one dead letter in ``rejected`` and no items."""
    try:
        return parse_batch(value)
    except Exception as exc:  # noqa: BLE001 - orjson's JSONDecodeError, or a str that is not UTF-8
        rejected.append(dead_letter(JOB, f"payload: not a JSON batch ({type(exc).__name__}: {exc})", value,
                                    topic=topic))
        return []


def dead_letters(rejected: list[tuple[Any, list[str]]], topic: str) -> list[str]:
    """The DLQ records of a batch's rejected items (``group_batch``/``group_gauges``), one per item."""
    out = []
    for item, problems in rejected:
        trace_id = item.get("trace_id") if isinstance(item, dict) else None
        out.append(dead_letter(JOB, "; ".join(problems), json_of(item), problems=problems, topic=topic,
                               trace_id=trace_id if isinstance(trace_id, str) else None))
    return out


def _add_totals(batch: MetricsBatch, labels: dict[str, str], cumulative: Cumulative, t: int) -> None:
    t0 = cumulative.start_ns
    batch.counter(P.REQUESTS, "{request}", labels, cumulative.requests, t0, t)
    for error, n in sorted(cumulative.errors.items()):
        batch.counter(P.ERRORS, "{request}", {**labels, P.LABEL_ERROR_TYPE: error}, n, t0, t)
    for kind, n in cumulative.tokens.items():
        batch.counter(P.TOKENS, "{token}", {**labels, P.LABEL_TOKEN_TYPE: kind}, n, t0, t)
    for field, (name, bounds) in P.DISTRIBUTIONS.items():
        total = cumulative.dists[field]
        if total.n:
            batch.histogram(name, "s", labels, bounds, total.counts, total.total, t0, t)
            offset, counts = total.exponential_buckets()
            batch.exponential_histogram(name, "s", labels, P.EXPONENTIAL_SCALE, total.zero, offset, counts,
                                        total.total, t0, t)


def _add_window(batch: MetricsBatch, labels: dict[str, str], stats: WindowStats, t: int,
                regions: int | None) -> None:
    batch.gauge(P.WINDOW_REQUESTS, "{request}", labels, stats.requests, t)
    if stats.requests:
        batch.gauge(P.WINDOW_ERROR_RATIO, "1", labels, stats.error_count / stats.requests, t)
    for field, (name, _bounds) in P.DISTRIBUTIONS.items():
        dist = stats.dists[field]
        for q in P.QUANTILES:
            value = dist.quantile(q)
            if value is not None:
                batch.gauge(name + P.WINDOW_QUANTILE_SUFFIX, "s", {**labels, P.LABEL_QUANTILE: str(q)}, value, t)
    if regions is not None:
        batch.gauge(P.ROLLUP_REGIONS, "{region}", labels, regions, t)


def encode_window(key: str, window_end_ns: int, stats: WindowStats, cumulative: Cumulative,
                  regions: int | None = None) -> bytes:
    """One window of one series: counters and histograms (cumulative), per-window gauges and quantiles; for a
    roll-up, ``regions``: how many regions' windows it merged (``P.ROLLUP_REGIONS``)."""
    labels = labels_of(key)
    batch = MetricsBatch(JOB)
    _add_totals(batch, labels, cumulative, window_end_ns)
    _add_window(batch, labels, stats, window_end_ns, regions)
    return batch.serialize()


def encode_window_gauges(key: str, time_ns: int, stats: WindowStats, regions: int | None = None) -> bytes:
    """A window's per-window gauges and quantiles alone, no counters: a roll-up window superseded by a late
    region's result, stamped just after the window's end (``functions.RollupWindows``). Counters at that old
    time would step back from the series' newer points; the late region's counts join the running totals."""
    labels = labels_of(key)
    batch = MetricsBatch(JOB)
    _add_window(batch, labels, stats, time_ns, regions)
    return batch.serialize()


def encode_totals(key: str, time_ns: int, cumulative: Cumulative) -> bytes:
    """A series' running totals alone (counters and cumulative histograms, no per-window figures): how late
    records reach Prometheus when the series has no next window to carry them."""
    batch = MetricsBatch(JOB)
    _add_totals(batch, labels_of(key), cumulative, time_ns)
    return batch.serialize()


def encode_late(region: str, total: int, start_ns: int, time_ns: int) -> bytes:
    batch = MetricsBatch(JOB)
    batch.counter(P.LATE_RECORDS, "{request}", {P.LABEL_REGION: region}, total, start_ns, time_ns)
    return batch.serialize()


# ---- pod gauges and cost ----

@dataclass(frozen=True)
class Pricing:
    """GPU $/hour by region and GPU type, from a JSON file: ``{"default": 2.5, "regions": {"us-east-1":
    {"H100": 4.1, "default": 3.0}}}``. Unknown region or type falls back to the region's then the global
    default."""

    table: dict[str, Any]

    @classmethod
    def load(cls, path: str | Path | None) -> Pricing:
        if path is None:
            path = Path(__file__).with_name("pricing.json")
        return cls(json.loads(Path(path).read_text()))

    def usd_per_gpu_hour(self, region: str, gpu_type: str) -> float:
        regional = self.table.get("regions", {}).get(region, {})
        return float(regional.get(gpu_type, regional.get("default", self.table.get("default", 0.0))))


@dataclass(slots=True)
class PodWindow:
    """The pods of one deployment (or roll-up) in one window: each pod's last value per gauge, and its GPUs.
    Pods are told apart by region and name (``pod``: the pod, ``pod/hw.id`` for a GPU's gauges)."""

    last: dict[tuple[str, str, str], tuple[int, float]]  # (metric, region, pod) -> (time_ns, value)
    gpus: dict[tuple[str, str], tuple[str, int]]          # (region, pod) -> (gpu type, GPU count)

    @classmethod
    def empty(cls) -> PodWindow:
        return cls({}, {})

    def add(self, g: dict[str, Any]) -> PodWindow:
        key = (g["metric"], g["region"], g["pod"])
        seen = self.last.get(key)
        if seen is None or g["time_ns"] >= seen[0]:
            self.last[key] = (g["time_ns"], g["value"])
        if g.get("gpu_count"):
            self.gpus[(g["region"], g["pod"].split("/", 1)[0])] = (g.get("gpu_type") or "", g["gpu_count"])
        return self

    @classmethod
    def of(cls, gauges: Iterable[dict[str, Any]]) -> PodWindow:
        window = cls.empty()
        for gauge in gauges:
            window.add(gauge)
        return window

    def merge(self, other: PodWindow) -> PodWindow:
        for key, (t, v) in other.last.items():
            seen = self.last.get(key)
            if seen is None or t >= seen[0]:
                self.last[key] = (t, v)
        self.gpus.update(other.gpus)
        return self

    def stats(self) -> dict[str, dict[str, float]]:
        """Per gauge, its roll-up stats (``P.POD_GAUGES``) over the pods' last values."""
        by_metric: dict[str, list[float]] = {}
        for (metric, _region, _pod), (_t, value) in self.last.items():
            by_metric.setdefault(metric, []).append(value)
        out: dict[str, dict[str, float]] = {}
        for metric, values in by_metric.items():
            funcs = {"sum": sum(values), "mean": sum(values) / len(values), "max": max(values), "min": min(values)}
            out[metric] = {stat: funcs[stat] for stat in P.POD_GAUGE_STATS[metric]}
        return out

    def _utilisation(self) -> dict[tuple[str, str], float]:
        """(region, pod) -> the mean of its GPUs' last utilisation, clamped to [0, 1]."""
        per_pod: dict[tuple[str, str], list[float]] = {}
        for (metric, region, pod), (_t, value) in self.last.items():
            if metric == M.HW_GPU_UTILIZATION:
                per_pod.setdefault((region, pod.split("/", 1)[0]), []).append(value)
        return {pod: min(max(sum(v) / len(v), 0.0), 1.0) for pod, v in per_pod.items()}

    def cost(self, window_s: float, pricing: Pricing) -> tuple[float, float, float]:
        """(GPU-seconds, cost $, idle cost $) of the window: every GPU of every pod seen is paid for, at its
        region's price; a pod's idle share is (1 - its mean GPU utilisation), zero when that is unknown."""
        utilisation = self._utilisation()
        gpu_seconds = cost = idle = 0.0
        for (region, pod), (gpu_type, count) in self.gpus.items():
            pod_cost = count * window_s * pricing.usd_per_gpu_hour(region, gpu_type) / 3600.0
            gpu_seconds += count * window_s
            cost += pod_cost
            util = utilisation.get((region, pod))
            if util is not None:
                idle += pod_cost * (1.0 - util)
        return gpu_seconds, cost, idle


def merged_pod_windows(windows: Iterable[PodWindow]) -> PodWindow:
    """One window of a deployment from the partial windows of its batches."""
    merged = PodWindow.empty()
    for window in windows:
        merged.merge(window)
    return merged


def encode_pods(key: str, window_end_ns: int, pods: PodWindow, cumulative: dict[str, float],
                start_ns: int) -> bytes:
    """A deployment's (or roll-up's) pod gauge stats for one window, and its cost counters (cumulative)."""
    batch = MetricsBatch(JOB)
    labels = deployment_labels(key)
    for metric, stats in sorted(pods.stats().items()):
        gauge = P.POD_GAUGES[metric]
        for stat, value in stats.items():
            batch.gauge(gauge.name, gauge.unit, {**labels, P.LABEL_STAT: stat}, value, window_end_ns)
    batch.counter(P.GPU_SECONDS, "s", labels, cumulative["gpu_seconds"], start_ns, window_end_ns)
    batch.counter(P.COST_USD, P.USD, labels, cumulative["cost_usd"], start_ns, window_end_ns)
    batch.counter(P.IDLE_COST_USD, P.USD, labels, cumulative["idle_usd"], start_ns, window_end_ns)
    return batch.serialize()


def encode_unit_cost(key: str, window_end_ns: int, cost_usd: float, output_tokens: int) -> bytes | None:
    """$ per 1M output tokens of a deployment's (or roll-up's) window (None without output tokens)."""
    if output_tokens <= 0 or cost_usd <= 0:  # no priced GPUs seen: no figure rather than a false $0
        return None
    batch = MetricsBatch(JOB)
    batch.gauge(P.USD_PER_1M_OUTPUT_TOKENS, P.USD, deployment_labels(key), cost_usd / output_tokens * 1e6,
                window_end_ns)
    return batch.serialize()
