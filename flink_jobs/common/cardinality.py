"""Cardinality bounds in the jobs (issue #20 item 3): per label, at most a configured number of distinct values
seen within a time span; a value past it is folded into ``schemas.pipeline.OVERFLOW_VALUE`` (``_OTHER``) and
counted per label. A value stays admitted while it keeps coming (its last sighting is within the span), so
well-behaved series keep their own labels however many one-off values flood in; a value unseen for the span
frees its slot. Pure: no PyFlink. Per operator instance (each parallel subtask bounds what it sees); not
checkpointed: after a restart, values are admitted afresh, in arrival order."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from infersight.schemas.pipeline import OVERFLOW_VALUE

# label -> the record field holding it; the request records' labels that come from clients or pods
REQUEST_LABELS = {"region": "region", "model": "model", "model_version": "model_version",
                  "error_type": "error_type"}
# a pod is no metric label (pods live only in one window's state), so pod names are not folded: folding them
# would merge pods and break the sums over them
GAUGE_LABELS = {"region": "region", "model": "model", "model_version": "model_version"}
DEFAULT_MAX_VALUES = 1000
DEFAULT_SPAN_MS = 3_600_000


class LabelLimiter:
    """``fold(record, now_ms)``: the record, or a copy with each label past its bound set to ``_OTHER``."""

    def __init__(self, limits: Mapping[str, int], span_ms: int = DEFAULT_SPAN_MS,
                 fields: Mapping[str, str] | None = None) -> None:
        self.limits, self.span_ms = dict(limits), span_ms
        self.fields = {label: (fields or {}).get(label, label) for label in self.limits}
        self.seen: dict[str, dict[Any, int]] = {label: {} for label in self.limits}  # value -> last seen ms
        self.folded: dict[str, int] = dict.fromkeys(self.limits, 0)

    def _admit(self, label: str, value: Any, now_ms: int) -> bool:
        seen = self.seen[label]
        if value in seen:
            seen[value] = now_ms
            return True
        if len(seen) >= self.limits[label]:  # full: free the slots of values unseen for the span
            horizon = now_ms - self.span_ms
            for old in [v for v, t in seen.items() if t < horizon]:
                del seen[old]
            if len(seen) >= self.limits[label]:
                return False
        seen[value] = now_ms
        return True

    def fold(self, record: dict[str, Any], now_ms: int) -> dict[str, Any]:
        out = record
        for label, field in self.fields.items():
            value = record.get(field)
            if value is None or value == OVERFLOW_VALUE or self._admit(label, value, now_ms):
                continue
            if out is record:
                out = dict(record)
            out[field] = OVERFLOW_VALUE
            self.folded[label] += 1
        return out

    def batch_fold(self, now_ms: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """``fold`` for the records of one batch (one ``now_ms``), asking the bound once per distinct combination
        of label values: within one ``now_ms`` a value's answer cannot change (an admitted value stays admitted;
        a refused one stays refused, the first refusal having freed every stale slot) and a repeated sighting
        only sets its last-seen time to the same ``now_ms``. The records and the per-record folded counts are
        those of ``fold``."""
        fields = tuple(self.fields.items())
        memo: dict[tuple[Any, ...], tuple[tuple[str, str], ...]] = {}  # label values -> (label, field) folded

        def fold(record: dict[str, Any]) -> dict[str, Any]:
            values = tuple(record.get(field) for _, field in fields)
            try:
                folded = memo.get(values)
            except TypeError:  # an unhashable value: fold says what it makes of it
                return self.fold(record, now_ms)
            if folded is None:
                out = self.fold(record, now_ms)
                memo[values] = tuple((label, field) for label, field in fields
                                     if out is not record and out.get(field) != record.get(field))
                return out
            if not folded:
                return record
            out = dict(record)
            for label, field in folded:
                out[field] = OVERFLOW_VALUE
                self.folded[label] += 1
            return out

        return fold


def limits_of(spec: str, labels: Mapping[str, str], default: int = DEFAULT_MAX_VALUES) -> dict[str, int]:
    """``--max-label-values``: ``N`` (every label) or ``label=N,label=N`` (others keep ``default``)."""
    limits = dict.fromkeys(labels, default)
    spec = spec.strip()
    if not spec:
        return limits
    if "=" not in spec:
        return dict.fromkeys(labels, int(spec))
    for part in spec.split(","):
        label, _, n = part.partition("=")
        if label.strip() in limits:
            limits[label.strip()] = int(n)
    return limits
