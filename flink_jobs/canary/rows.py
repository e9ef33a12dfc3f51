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

    # pickled as its columns (the label index is rebuilt only if rows are appended after unpickling)
    def __getstate__(self) -> tuple[Any, ...]:
        return (self.metrics, self.labels, self.end_ns, self.label, self.judged, self.values, self.weights)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.metrics, self.labels, self.end_ns, self.label, self.judged, self.values, self.weights = state
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
