"""The every-request drift signals of request records (``schemas.quality_signals``), binned per group of records:
the metrics job bins each (series, window) group of a batch here and publishes the window's sums on
``infersight.quality_signals``; the quality job turns them (or, on its reference path, request records binned by
the same function) into its window aggregates' histograms.

A group's signals are one row of integers (``WIDTH``): each signal's bin counts, signal after signal in
``REQUEST_SIGNALS`` order (``SLICES``), then each signal's sample count (``N_AT``). Rows add: a window's row is
the sum of its groups' rows. Pure (numpy): no PyFlink."""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from infersight.schemas.quality import DRIFT_SIGNAL_BY_NAME, ERROR_TYPES, FINISH_REASONS, DriftSignal
from infersight.schemas.quality_signals import REQUEST_SIGNALS

SIGNALS: tuple[DriftSignal, ...] = tuple(DRIFT_SIGNAL_BY_NAME[name] for name in REQUEST_SIGNALS)
_OFFSETS = np.cumsum([0, *(s.bins for s in SIGNALS)])
SLICES: dict[str, slice] = {s.name: slice(int(a), int(b)) for s, a, b in zip(SIGNALS, _OFFSETS, _OFFSETS[1:],
                                                                               strict=False)}
N_AT: dict[str, int] = {s.name: int(_OFFSETS[-1]) + i for i, s in enumerate(SIGNALS)}
WIDTH = int(_OFFSETS[-1]) + len(SIGNALS)

Row = tuple[int, ...]  # what crosses between operators: a tuple of ints pickles small (a byte or two per bin)


def bin_index(signal: DriftSignal, values: np.ndarray) -> np.ndarray:
    """Each value's bin (categorical: its category index); the last edge may be +inf, and values are clipped
    into the outer bins so nothing falls outside."""
    values = np.asarray(values, dtype=float)
    if signal.categories:
        return values.astype(int)
    edges = np.asarray(signal.edges, dtype=float)
    return np.clip(np.searchsorted(edges, values, side="right") - 1, 0, signal.bins - 1)


def category(values: Sequence[Any], categories: tuple[str, ...], none_as: str) -> np.ndarray:
    """Each value's index in ``categories`` (``none_as``'s for None, ``other``'s for a value not among them)."""
    index = {c: i for i, c in enumerate(categories)}
    other = index["other"]
    return np.array([index.get(v if v is not None else none_as, other) for v in values], dtype=int)


def error_kind(error_type: Any) -> str | None:
    """An error type (an exception's class name, an HTTP status, a code) folded into ``ERROR_TYPES``."""
    if error_type is None:
        return None
    return _error_kind_of(str(error_type))


@functools.lru_cache(maxsize=4096)  # a few distinct error types, every request of a failing series asks again
def _error_kind_of(error_type: str) -> str:
    e = error_type.lower()
    for kind, marks in (("timeout", ("timeout", "deadline")), ("cancelled", ("cancel",)),
                        ("server", ("5", "server", "internal")), ("client", ("4", "client", "invalid"))):
        if any(e.startswith(m) if len(m) == 1 else m in e for m in marks):
            return kind
    return "other"


_FIELDS = ("tokens_in", "tokens_out", "ttft_s", "finish_reason", "error_type")  # what the signals read of a record
_FIELDS_OF = operator.itemgetter(*_FIELDS)
_FINISH_INDEX = {c: i for i, c in enumerate(FINISH_REASONS)}
_ERROR_INDEX: dict[Any, int] = {None: ERROR_TYPES.index("none")}  # error type -> its kind's index, as learnt
_MAX_ERROR_TYPES = 4096


def _error_index(error_type: Any) -> int:
    index = ERROR_TYPES.index(error_kind(error_type))
    if len(_ERROR_INDEX) < _MAX_ERROR_TYPES:  # a bounded memo: a flood of distinct types is folded each time
        _ERROR_INDEX[error_type] = index
    return index


def signal_rows(groups: Sequence[Sequence[dict[str, Any]]]) -> np.ndarray:
    """One row (``WIDTH`` int64) per group of valid request records: each signal binned in one numpy pass over
    every record of every group and counted per group with one ``bincount`` of (group, bin), not a numpy call per
    group and signal (a batch has a group per window and series)."""
    records = [r for recs in groups for r in recs]
    rows = np.zeros((len(groups), WIDTH), dtype=np.int64)
    if not records:
        return rows
    group = np.repeat(np.arange(len(groups)), [len(recs) for recs in groups])
    try:  # one C call per record where every field is there (as normalize writes records: absent ones as null)
        tokens_in, tokens_out, ttft_values, finishes, error_types = zip(*map(_FIELDS_OF, records), strict=True)
    except KeyError:
        tokens_in, tokens_out, ttft_values, finishes, error_types = zip(
            *([r.get(f) for f in _FIELDS] for r in records), strict=True)
    has_ttft = np.array([v is not None for v in ttft_values], dtype=bool)
    finish, other_finish = _FINISH_INDEX, _FINISH_INDEX["other"]
    errors = _ERROR_INDEX
    columns = {
        "tokens_in": (np.array([v or 0 for v in tokens_in], dtype=float), None),
        "tokens_out": (np.array([v or 0 for v in tokens_out], dtype=float), None),
        "ttft": (np.array([v for v in ttft_values if v is not None], dtype=float), has_ttft),
        # category(..., FINISH_REASONS, "other") and category(map(error_kind, ...), ERROR_TYPES, "none"), each a
        # dict lookup per record (error types learnt once each)
        "finish_reason": (np.array([finish.get(v, other_finish) for v in finishes]), None),
        "error_type": (np.array([errors[e] if e in errors else _error_index(e) for e in error_types]), None),
    }
    for signal in SIGNALS:
        values, mask = columns[signal.name]
        of_group = group if mask is None else group[mask]
        rows[:, SLICES[signal.name]] = np.bincount(of_group * signal.bins + bin_index(signal, values),
                                                   minlength=len(groups) * signal.bins).reshape(len(groups),
                                                                                                signal.bins)
        rows[:, N_AT[signal.name]] = np.bincount(of_group, minlength=len(groups))
    return rows


def signals_of(row: Row | np.ndarray) -> dict[str, tuple[int, list[int]]]:
    """A row as ``{signal: (n, bin counts)}`` (``schemas.quality_signals.record``'s ``signals``)."""
    values = list(row)
    return {name: (int(values[N_AT[name]]), [int(c) for c in values[SLICES[name]]]) for name in REQUEST_SIGNALS}
