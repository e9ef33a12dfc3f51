"""One canary bake, pure (no PyFlink): per-request records of a model's stable and canary tracks in one region
(or all regions) go into bounded per-side reservoirs; ``evaluate`` judges every metric and gives the verdict
``pass`` / ``marginal`` / ``fail`` / ``inconclusive`` with its reasons and per-metric results.

False fails are controlled over all metrics and all interim looks together: Bonferroni over the metrics that
have data, and Lan–DeMets O'Brien–Fleming alpha spending over the looks (each look tests at the alpha spent
since the previous one, so by the union bound P(any false fail in the bake) <= ``alpha``).

A metric fails when its rank (or proportion) test rejects at the look's alpha AND the shift estimate is worse
than stable by more than its tolerance; significantly worse but within tolerance is ``marginal``. A critical
metric failing fails the canary at once (the early fail: O'Brien–Fleming spends little early, so only a
clear effect fails early); the bake is final at ``bake_s``.

Only the same time is compared: values before the bake's start are ignored, and both sides' reservoirs span
the same period, so a cause shared by both tracks (a stable that degrades during the bake) moves both."""

from __future__ import annotations

import functools
import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infersight.flink_jobs.canary.metrics import DEFAULT_METRICS, MetricSpec, Record
from infersight.flink_jobs.canary.reservoir import DEFAULT_CAPACITY, Reservoir
from infersight.flink_jobs.canary.rows import JUDGED, UNTRACKED, Projector, Rows, rows_of
from infersight.flink_jobs.canary.stats import (
    alpha_spent,
    compare_proportions,
    hodges_lehmann,
    hodges_lehmann_interval,
    rank_p_value,
)

ALL_REGIONS = ""  # the overall bake of a model: every region's records
SIDES = ("canary", "stable")
VERDICTS = ("pass", "marginal", "fail", "inconclusive")
NS = 1_000_000_000

__all__ = ["ALL_REGIONS", "JUDGED", "NS", "SIDES", "Bake", "BakeConfig", "projector"]


@functools.cache
def projector(metrics: tuple[MetricSpec, ...]) -> Projector:
    """The records' projection for a metric table (one per table: the job has one)."""
    return Projector(metrics)


@dataclass(frozen=True)
class BakeConfig:
    bake_s: float = 600.0
    interval_s: float = 30.0              # how often the job evaluates (the looks)
    alpha: float = 0.01                   # false-fail rate over all metrics and looks
    reservoir: int = DEFAULT_CAPACITY     # values kept per side and metric
    max_untracked_ratio: float = 0.01     # requests without a track label, of the model's requests
    max_region_skew_s: float = 60.0       # newest request times of regions further apart: clock skew
    max_region_mix: float = 0.1           # overall bake: total variation distance of the sides' region mixes
    metrics: tuple[MetricSpec, ...] = DEFAULT_METRICS


class Proportion:
    """Weighted hits of a flag; the effective sample size is Kish's (sum w)^2 / sum w^2."""

    def __init__(self) -> None:
        self.hits = self.weight = self.weight_sq = 0.0
        self.seen = 0

    def add(self, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=np.float64)
        self.seen += len(values)
        self.hits += float(np.dot(values, w))
        self.weight += float(w.sum())
        self.weight_sq += float(np.dot(w, w))

    @property
    def effective_n(self) -> float:
        return self.weight ** 2 / self.weight_sq if self.weight_sq else 0.0

    @property
    def ratio(self) -> float | None:
        return self.hits / self.weight if self.weight else None


@dataclass
class Bake:
    model: str
    region: str
    start_ns: int
    config: BakeConfig = field(default_factory=BakeConfig)
    sides: dict[str, dict[str, Reservoir | Proportion]] = field(default_factory=dict)
    versions: dict[str, dict[str, list[int]]] = field(default_factory=lambda: {s: {} for s in SIDES})
    region_last_ns: dict[str, int] = field(default_factory=dict)
    region_counts: dict[str, dict[str, int]] = field(default_factory=lambda: {s: {} for s in SIDES})
    untracked: int = 0
    tracked: int = 0
    spent: float = 0.0                    # information fraction of the last look
    looks: int = 0
    final: dict[str, Any] | None = None   # the verdict once final (at the bake's end or an early fail)

    def __post_init__(self) -> None:
        for side in SIDES:
            self.sides.setdefault(side, {})
            for spec in self.config.metrics:
                if spec.name not in self.sides[side]:
                    seed = zlib.crc32(f"{self.model}|{self.region}|{side}|{spec.name}".encode())
                    self.sides[side][spec.name] = (Proportion() if spec.kind == "proportion"
                                                   else Reservoir(self.config.reservoir, seed))

    # -- input -------------------------------------------------------------------------------------------
    def add_records(self, records: list[Record]) -> None:
        """Request records of this bake's model (and region, unless overall). Records of the shadow track and
        those that ended before the bake's start are ignored; records without a track are counted."""
        self.add_rows(rows_of(records, projector(self.config.metrics)))

    def add_rows(self, rows: Rows) -> None:
        """``add_records`` on records projected by the job's route step (``rows.Rows``), vectorised: the same
        values in the same order, so the reservoirs draw the same keys as from the records."""
        names = tuple(m.name for m in self.config.metrics)
        if rows.metrics != names:
            raise ValueError(f"rows projected for metrics {rows.metrics}, the bake judges {names}")
        n = len(rows)
        end_ns = np.frombuffer(rows.end_ns, dtype=np.int64) if n else np.empty(0, dtype=np.int64)
        after = end_ns >= self.start_ns
        if not after.any():
            return
        label = np.frombuffer(rows.label, dtype=np.int32)
        side = np.array([s for s, _, _ in rows.labels], dtype=np.int8)[label]
        judged = np.frombuffer(rows.judged, dtype=np.int8).astype(bool)
        self.untracked += int(np.count_nonzero(after & (side == UNTRACKED)))  # judged ones are not in rows
        self._saw_rows(rows, end_ns, label, after & ~judged & (side != UNTRACKED))
        values = np.frombuffer(rows.values, dtype=np.float64).reshape(n, len(names))
        weights = np.frombuffer(rows.weights, dtype=np.float64).reshape(n, -1) if rows.weights else None
        sampled = 0
        for j, spec in enumerate(self.config.metrics):
            column = values[:, j]
            finite = np.isfinite(column) & after
            for code, name in enumerate(SIDES):
                keep = finite & (side == code)
                if keep.any():
                    w = weights[keep, sampled] if spec.sample_rate_field and weights is not None \
                        else np.ones(int(np.count_nonzero(keep)))
                    self.add_values(name, spec.name, column[keep], w)
            sampled += bool(spec.sample_rate_field)

    def _saw_rows(self, rows: Rows, end_ns: np.ndarray, label: np.ndarray, traffic: np.ndarray) -> None:
        """``saw`` once per label (side, version, region) of the rows' requests, in order of first appearance
        (the order per-record calls would have inserted them in: the dicts' order breaks the checks' ties)."""
        labels, ends = label[traffic], end_ns[traffic]
        if not labels.size:
            return
        present, first = np.unique(labels, return_index=True)
        for index in present[np.argsort(first)]:
            of_label = ends[labels == index]
            side, version, region = rows.labels[index]
            self.saw(SIDES[side], version, region, int(of_label.max()), int(of_label.min()), int(of_label.size))

    def saw(self, track: str, version: str, region: str, last_ns: int, first_ns: int | None = None,
            requests: int = 1) -> None:
        """Traffic of a track: its version label, region and request times (what the input checks read)."""
        self.tracked += requests
        self.region_last_ns[region] = max(self.region_last_ns.get(region, 0), last_ns)
        counts = self.region_counts[track]
        counts[region] = counts.get(region, 0) + requests
        first = last_ns if first_ns is None else first_ns
        seen = self.versions[track].setdefault(version, [first, last_ns])
        seen[0], seen[1] = min(seen[0], first), max(seen[1], last_ns)

    def add_values(self, side: str, metric: str, values: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Values of one metric on one side (the benchmark's vectorised path; records go through
        ``add_records``, which also keeps the version, region and track checks)."""
        self.sides[side][metric].add(values, weights)

    # -- judging -----------------------------------------------------------------------------------------
    def problems(self) -> list[str]:
        """Why no verdict can be trusted (bad input): each a sentence naming the cause."""
        out = []
        canary, stable = self.versions["canary"], self.versions["stable"]
        if not canary:
            out.append(f"no canary traffic for {self.model} since the bake started")
        if not stable:
            out.append(f"canary of {self.model} has no stable counterpart (no stable traffic"
                       f"{' in ' + self.region if self.region else ''} since the bake started)")
        if len(canary) > 1:
            spans = sorted(canary.items(), key=lambda kv: kv[1][0])
            overlap = any(a[1][1] >= b[1][0] for a, b in zip(spans, spans[1:], strict=False))
            names = ", ".join(repr(v) for v, _ in spans)
            out.append(f"two canaries of {self.model} at once ({names}): judge one version per rollout" if overlap
                       else f"canary version label changed mid-bake ({names}): restart the bake for the new one")
        total = self.tracked + self.untracked
        if total and self.untracked / total > self.config.max_untracked_ratio:
            out.append(f"{self.untracked} of {total} requests of {self.model} carry no track label")
        if len(self.region_last_ns) > 1:
            newest, oldest = max(self.region_last_ns.values()), min(self.region_last_ns.values())
            if (newest - oldest) / NS > self.config.max_region_skew_s:
                ahead = max(self.region_last_ns, key=self.region_last_ns.__getitem__)
                behind = min(self.region_last_ns, key=self.region_last_ns.__getitem__)
                out.append(f"clock skew between regions: {ahead} is {(newest - oldest) / NS:.0f} s ahead of "
                           f"{behind} (limit {self.config.max_region_skew_s:.0f} s)")
        if self.region == ALL_REGIONS and canary and stable:
            distance = _mix_distance(self.region_counts["canary"], self.region_counts["stable"])
            if distance > self.config.max_region_mix:
                out.append(f"canary and stable serve different region mixes (distance {distance:.2f}): "
                           "read the per-region verdicts")
        return out

    def evaluate(self, now_ns: int) -> dict[str, Any]:
        """The verdict at event time ``now_ns`` (one look). Final at the bake's end or on an early fail; a
        final verdict is returned unchanged afterwards."""
        if self.final is not None:
            return self.final
        elapsed = max(0.0, (now_ns - self.start_ns) / NS)
        information = min(1.0, elapsed / self.config.bake_s)
        is_final = information >= 1.0
        present = [s for s in self.config.metrics
                   if any(self._count(side, s) for side in SIDES)]
        alpha_look = (alpha_spent(information, self.config.alpha)
                      - alpha_spent(self.spent, self.config.alpha)) / max(1, len(present))
        self.spent, self.looks = max(self.spent, information), self.looks + 1
        results = [self._judge(spec, alpha_look, is_final) for spec in present]
        reasons = self.problems()
        failed = [r for r in results if r["status"] == "fail" and r["critical"]]
        if reasons:
            verdict = "inconclusive"
        elif failed:
            verdict, is_final = "fail", True
            reasons = [f"{r['metric']} worse by {_fmt(r)} (tolerance {r['tolerance']:g})" for r in failed]
        elif any(r["status"] in ("fail", "marginal") for r in results):
            verdict = "marginal"
            reasons = [f"{r['metric']}: {r['status']} by {_fmt(r)}" for r in results
                       if r["status"] in ("fail", "marginal")]
        elif not is_final:
            verdict, reasons = "inconclusive", [f"baking: {elapsed:.0f} of {self.config.bake_s:.0f} s"]
        else:
            short = [r for r in results if r["critical"] and r["status"] == "insufficient"]
            missing = [s.name for s in self.config.metrics if s.critical and s.name in ("ttft_s", "error_ratio")
                       and s not in present]
            if short or missing:
                verdict = "inconclusive"
                reasons = [f"{r['metric']}: too few samples (canary {r['n_canary']}, stable {r['n_stable']}, "
                           f"need {r['min_samples']})" for r in short] + [f"{m}: no data" for m in missing]
            else:
                verdict, reasons = "pass", []
        out = {"model": self.model, "canary_version": self._version("canary"), "region": self.region,
               "stable_versions": sorted(self.versions["stable"]), "verdict": verdict, "final": is_final,
               "reasons": reasons, "look": self.looks, "elapsed_s": round(elapsed, 3),
               "bake_s": self.config.bake_s, "start_ns": self.start_ns, "at_ns": now_ns,
               "alpha_look": alpha_look, "metrics": results}
        if is_final:
            self.final = out
        return out

    def _count(self, side: str, spec: MetricSpec) -> float:
        acc = self.sides[side][spec.name]
        return acc.effective_n if isinstance(acc, Proportion) else len(acc)

    def _version(self, side: str) -> str:
        seen = self.versions[side]
        return max(seen, key=lambda v: seen[v][1]) if seen else ""

    def _judge(self, spec: MetricSpec, alpha_look: float, is_final: bool) -> dict[str, Any]:
        canary, stable = self.sides["canary"][spec.name], self.sides["stable"][spec.name]
        n_c, n_s = self._count("canary", spec), self._count("stable", spec)
        out: dict[str, Any] = {"metric": spec.name, "critical": spec.critical, "worse": spec.worse,
                               "tolerance": spec.tolerance, "relative": spec.relative,
                               "min_samples": spec.min_samples, "n_canary": round(n_c), "n_stable": round(n_s),
                               "shift": None, "ci_low": None, "ci_high": None, "p_value": None}
        if min(n_c, n_s) < spec.min_samples:
            return {**out, "status": "insufficient"}
        confidence = 1.0 - max(alpha_look, 1e-15)
        if isinstance(canary, Proportion) and isinstance(stable, Proportion):
            out["canary"], out["stable"] = canary.ratio, stable.ratio
            c = compare_proportions((canary.ratio or 0.0) * n_c, n_c, (stable.ratio or 0.0) * n_s, n_s, confidence)
            shift, p_value, interval = c.shift, c.p_value, (c.ci_low, c.ci_high)
        else:
            assert isinstance(canary, Reservoir) and isinstance(stable, Reservoir)
            x, y = canary.values, stable.values
            if spec.relative:
                x, y = np.log(np.maximum(x, 1e-12)), np.log(np.maximum(y, 1e-12))
            out["canary"], out["stable"] = float(np.median(canary.values)), float(np.median(stable.values))
            p_value = rank_p_value(x, y)
            out["p_value"] = p_value
            if p_value >= alpha_look and not is_final:
                return {**out, "status": "pass"}  # the shift (the costly part) only where it decides or reports
            shift, interval = hodges_lehmann(x, y), None
        worse = {"higher": shift > 0, "lower": shift < 0, "either": shift != 0}[spec.worse]
        if spec.relative:  # log-scale shift -> relative change
            shift = math.expm1(shift)
        if p_value >= alpha_look or not worse:
            status = "pass"
        else:
            status = "fail" if abs(shift) > spec.tolerance else "marginal"
        if interval is None and (is_final or (status == "fail" and spec.critical)):
            interval = hodges_lehmann_interval(x, y, confidence)
        if interval is not None and spec.relative:
            interval = (math.expm1(interval[0]), math.expm1(interval[1]))
        low, high = interval if interval is not None else (None, None)
        out.update(shift=shift, ci_low=low, ci_high=high, p_value=p_value, confidence=confidence)
        return {**out, "status": status}

    def to_state(self) -> dict[str, Any]:
        return {"model": self.model, "region": self.region, "start_ns": self.start_ns,
                "sides": {s: {m: (acc.to_state() if isinstance(acc, Reservoir) else vars(acc).copy())
                              for m, acc in metrics.items()} for s, metrics in self.sides.items()},
                "versions": self.versions, "region_last_ns": self.region_last_ns,
                "region_counts": self.region_counts, "untracked": self.untracked, "tracked": self.tracked,
                "spent": self.spent, "looks": self.looks, "final": self.final}

    @classmethod
    def from_state(cls, state: dict[str, Any], config: BakeConfig | None = None) -> Bake:
        sides: dict[str, dict[str, Reservoir | Proportion]] = {}
        for side, metrics in state["sides"].items():
            sides[side] = {}
            for name, acc in metrics.items():
                if "capacity" in acc:
                    sides[side][name] = Reservoir.from_state(acc)
                else:
                    p = Proportion()
                    vars(p).update(acc)
                    sides[side][name] = p
        return cls(state["model"], state["region"], state["start_ns"], config or BakeConfig(), sides,
                   state["versions"], state["region_last_ns"], state["region_counts"], state["untracked"],
                   state["tracked"], state["spent"], state["looks"], state["final"])


def _mix_distance(a: dict[str, int], b: dict[str, int]) -> float:
    """Total variation distance between two region mixes (counts by region)."""
    ta, tb = sum(a.values()) or 1, sum(b.values()) or 1
    return 0.5 * sum(abs(a.get(r, 0) / ta - b.get(r, 0) / tb) for r in set(a) | set(b))


def _fmt(result: dict[str, Any]) -> str:
    shift = result["shift"]
    return f"{shift:+.1%}" if result["relative"] else f"{shift:+.4f}"
