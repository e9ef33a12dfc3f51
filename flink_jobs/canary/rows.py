"""The canary bake's input in compact form: of each request record (or judged result), only what ``Bake`` reads —
its end time, side (canary / stable / untracked), version and region labels, whether it is a judge's result, and
each metric's value (``MetricSpec.extract``, NaN where the bake would skip it) with the sampled metrics' weights.

Why: the job's route step used to pickle every whole record (about 30 fields) once per bake key, twice per
record (its region's key and the model's overall key), and each bake re-extracted the metrics from the dicts.
A record is now projected once in the route step; both keys get the same values as flat ``array`` columns,
which pickle as a few byte strings and turn into numpy arrays without a per-record loop.

Rows the bake would ignore whatever its start are not kept: the shadow track (never compared, never counted)
and a judge's result without a canary/stable track (never counted). Everything else is kept, so a bake fed
``Rows`` gets exactly the values, in the same order, that it got from the records (the reservoirs draw the
same keys: the same verdicts; ``tests/unit/test_canary_rows.py``)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from infersight.flink_jobs.canary.metrics import DEFAULT_METRICS, MetricSpec, Record

SIDE_CODES = {"canary": 0, "stable": 1}   # the order of core.SIDES
UNTRACKED = 2                             # a request without a canary/stable track: counted, not compared
JUDGED = "judged"                         # marks a judge's result (stream.judged_item): only the sampled metrics
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
NAN = float("nan")

# (end_ns, side, judged, version, region, values, weights): one record as projected, shared by its bake keys
Row = tuple[int, int, bool, str, str, tuple[float, ...], tuple[float, ...]]


class Projector:
    """Records -> ``Row``s for one metric table (``BakeConfig.metrics``)."""

    def __init__(self, metrics: Sequence[MetricSpec] = DEFAULT_METRICS) -> None:
        self.metrics = tuple(metrics)
        self.names = tuple(m.name for m in self.metrics)
        self.sampled = tuple(m for m in self.metrics if m.sample_rate_field)
        self._untracked_values = (NAN,) * len(self.metrics)
        self._untracked_weights = (NAN,) * len(self.sampled)

    def row(self, record: Record) -> Row | None:
        """What the bake reads of ``record``; None when no bake would read anything of it."""
        end_ns = record.get("end_ns")
        if not isinstance(end_ns, int) or not INT64_MIN <= end_ns <= INT64_MAX:
            return None
        track = record.get("track")
        judged = bool(record.get(JUDGED))
        side = SIDE_CODES.get(track) if isinstance(track, str) else None
        if side is None:
            if track == "shadow" or judged:
                return None
            return end_ns, UNTRACKED, False, "", "", self._untracked_values, self._untracked_weights
        version = str(record.get("model_version") or "")
        region = str(record.get("region", ""))
        values, weights = [], []
        for spec in self.metrics:
            value = NAN if judged and not spec.sample_rate_field else spec.extract(record)
            if value is None or not math.isfinite(value):
                value = NAN
            if spec.sample_rate_field:
                rate = record.get(spec.sample_rate_field)
                if not isinstance(rate, int | float) or not 0 < rate <= 1:
                    value, weight = NAN, NAN  # a sampled value without its rate cannot be weighted
                else:
                    weight = 1.0 / rate
                weights.append(weight)
            values.append(value)
        return end_ns, side, judged, version, region, tuple(values), tuple(weights)


class Rows:
    """One bake key's rows of one batch, in record order, as columns. ``labels``: (side, version, region) per
    distinct label, ``label``: each row's index into it."""

    __slots__ = ("metrics", "labels", "_index", "end_ns", "label", "judged", "values", "weights")

    def __init__(self, metrics: tuple[str, ...] = tuple(m.name for m in DEFAULT_METRICS)) -> None:
        self.metrics = metrics
        self.labels: list[tuple[int, str, str]] = []
        self._index: dict[tuple[int, str, str], int] = {}
        self.end_ns, self.label, self.judged = array("q"), array("i"), array("b")
        self.values, self.weights = array("d"), array("d")

    def append(self, row: Row) -> None:
        end_ns, side, judged, version, region, values, weights = row
        key = (side, version, region)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.labels)
            self.labels.append(key)
        self.end_ns.append(end_ns)
        self.label.append(index)
        self.judged.append(judged)
        self.values.extend(values)
        self.weights.extend(weights)

    def __len__(self) -> int:
        return len(self.end_ns)

    def canary_versions(self) -> set[str]:
        """Version labels of the canary requests (not judged results) in these rows."""
        return {version for side, version, _region in self._traffic_labels(SIDE_CODES["canary"])}

    def first_canary_ns(self) -> int | None:
        """The end time of the first canary request (what starts a bake), None without one."""
        canary = {i for i, (side, _, _) in enumerate(self.labels) if side == SIDE_CODES["canary"]}
        ends = [e for e, lab, j in zip(self.end_ns, self.label, self.judged, strict=True) if lab in canary and not j]
        return min(ends) if ends else None

    def _traffic_labels(self, side: int) -> list[tuple[int, str, str]]:
        used = {lab for lab, j in zip(self.label, self.judged, strict=True) if not j}
        return [key for i, key in enumerate(self.labels) if key[0] == side and i in used]

    @classmethod
    def of_columns(cls, metrics: tuple[str, ...], labels: list[tuple[int, str, str]], end_ns: np.ndarray,
                   label: np.ndarray, judged: np.ndarray, values: np.ndarray, weights: np.ndarray) -> Rows:
        """Rows from numpy columns (``BatchColumns``): ``values`` (rows x metrics) and ``weights`` (rows x
        sampled metrics) row-major, as ``append`` lays them out. ``labels`` may hold labels no row uses."""
        out = cls(metrics)
        out.labels = labels
        out._index = {key: i for i, key in enumerate(labels)}
        out.end_ns.frombytes(np.ascontiguousarray(end_ns, dtype=np.int64).tobytes())
        out.label.frombytes(np.ascontiguousarray(label, dtype=np.int32).tobytes())
        out.judged.frombytes(np.ascontiguousarray(judged, dtype=np.int8).tobytes())
        out.values.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        out.weights.frombytes(np.ascontiguousarray(weights, dtype=np.float64).tobytes())
        return out

    # Pickled as its columns, less those without a finite value (no bake reads them: a request batch's sampled
    # metrics and their weights), which come back as NaN; the label index is rebuilt for appends after.
    def __getstate__(self) -> tuple[Any, ...]:
        n, width = len(self.end_ns), len(self.metrics)
        values = np.frombuffer(self.values, dtype=np.float64).reshape(n, width)
        used = np.isfinite(values).any(axis=0)
        weights = np.frombuffer(self.weights, dtype=np.float64)
        sampled_width = weights.size // n if n else 0
        if not np.isfinite(weights).any():
            weights = None
        return (self.metrics, self.labels, self.end_ns, self.label, self.judged, used.tobytes(),
                np.ascontiguousarray(values[:, used]).tobytes(), sampled_width,
                None if weights is None else weights.tobytes())

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.metrics, self.labels, self.end_ns, self.label, self.judged, used, values, sampled_width, weights = state
        n, width = len(self.end_ns), len(self.metrics)
        full = np.full((n, width), np.nan)
        kept = np.frombuffer(used, dtype=bool)
        full[:, kept] = np.frombuffer(values, dtype=np.float64).reshape(n, int(kept.sum()))
        self.values = array("d", full.tobytes())
        self.weights = array("d", np.full(n * sampled_width, np.nan).tobytes() if weights is None else weights)
        self._index = {key: i for i, key in enumerate(self.labels)}


def rows_of(records: Iterable[Record], projector: Projector | None = None) -> Rows:
    """Request records (or judged items) of one bake key as ``Rows``."""
    projector = projector or Projector()
    out = Rows(projector.names)
    for record in records:
        row = projector.row(record)
        if row is not None:
            out.append(row)
    return out


_NONE = type(None)
_FLOATS = frozenset({float, _NONE})


class BatchColumns:
    """A batch's request records projected at once, as numpy columns: ``Projector.row`` for every record, without
    a per-record loop over the metrics. Only for the default metric table and well-typed request records (what
    the normaliser writes: latencies floats or null, token counts integers, labels strings, no judged results);
    ``of`` returns None otherwise, and the caller projects record by record (``tests/unit/test_canary_rows.py``
    checks both give the same rows)."""

    __slots__ = ("labels", "keep", "end_ns", "label", "judged", "values", "weights")

    @classmethod
    def of(cls, items: list[Record], metrics: tuple[MetricSpec, ...]) -> BatchColumns | None:
        if metrics != DEFAULT_METRICS or not items:
            return None
        try:
            return cls._of(items)
        except (TypeError, ValueError, OverflowError):  # a value numpy cannot take as the metric reads it
            return None

    @classmethod
    def _of(cls, items: list[Record]) -> BatchColumns | None:
        get = [r.get for r in items]
        if any(g(JUDGED) for g in get) or any(g("quality_sample_rate") is not None for g in get):
            return None  # judged results: the sampled metrics (route_evaluations' items go record by record)
        tracks = [g("track") for g in get]
        versions = [g("model_version") for g in get]
        if not {type(t) for t in tracks} | {type(v) for v in versions} <= {str, _NONE}:
            return None
        floats = {}
        for name in ("ttft_s", "e2e_s", "itl_p50_s", "decode_s"):
            column = [g(name) for g in get]
            if not {type(x) for x in column} <= _FLOATS:
                return None
            floats[name] = np.array(column, dtype=np.float64)  # null -> NaN: skipped, as None is
        outs = [g("tokens_out") for g in get]
        if not {type(x) for x in outs} <= {int, _NONE}:
            return None
        has_out = np.array([x is not None for x in outs])
        out = np.array([0 if x is None else x for x in outs], dtype=np.int64)
        if np.any(np.abs(out) >= 1 << 53):
            return None  # beyond exact float conversion
        errored = np.fromiter(map(bool, (g("error_type") for g in get)), dtype=bool, count=len(items))

        side_codes = [SIDE_CODES.get(t, UNTRACKED) if t != "shadow" else -1 for t in tracks]
        index: dict[tuple[int, str, str], int] = {}
        label = []
        for side, version, g in zip(side_codes, versions, get, strict=True):
            key = (side, version or "", g("region", "")) if side in (0, 1) else (side, "", "")
            i = index.get(key)
            if i is None:
                i = index[key] = len(index)
            label.append(i)
        self = cls()
        self.labels = list(index)
        self.keep = np.array(side_codes) >= 0  # the shadow track: no bake reads it
        self.end_ns = np.array([g("end_ns") for g in get], dtype=np.int64)
        self.label = np.array(label, dtype=np.int32)
        self.judged = np.zeros(len(items), dtype=np.int8)
        out_f = out.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(has_out & (out > 1), floats["decode_s"] / (out_f - 1.0), np.nan)
        tokens = np.where(has_out & (out > 0) & ~errored, out_f, np.nan)
        nan = np.full(len(items), np.nan)
        values = np.column_stack([floats["ttft_s"], floats["e2e_s"], floats["itl_p50_s"], tpot,
                                  errored.astype(np.float64), tokens, nan, nan])  # DEFAULT_METRICS' order
        untracked = np.array([s == UNTRACKED for s in side_codes])
        values[untracked] = np.nan  # counted, never compared
        self.values = values
        self.weights = np.full((len(items), 2), np.nan)  # no sample rate on a request: the sampled metrics skip
        return self

    def rows(self, metrics: tuple[str, ...], indices: list[int]) -> Rows | None:
        """The rows of these records (indices into the batch), None when no bake reads any."""
        idx = np.asarray(indices, dtype=np.intp)
        idx = idx[self.keep[idx]]
        if not idx.size:
            return None
        return Rows.of_columns(metrics, self.labels, self.end_ns[idx], self.label[idx], self.judged[idx],
                               self.values[idx], self.weights[idx])
