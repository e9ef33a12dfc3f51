"""String keys of keyed streams: fields joined by an ASCII unit separator (never in a label value the
contract allows), and a time in milliseconds appended for per-window (or per-bucket) keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infersight.schemas import pipeline as P

SEP = "\x1f"


def series_key(record: Mapping[str, Any]) -> str:
    """A request record's series: region, model, model version, track, engine (``P.SERIES_LABELS``, in order;
    bounded label values)."""
    return SEP.join((record["region"], record["model"], record.get("model_version") or "",
                     record.get("track") or "stable", record.get("engine") or "custom"))


def labels_of(key: str) -> dict[str, str]:
    """A series key as its metric labels."""
    return dict(zip(P.SERIES_LABELS, key.split(SEP), strict=True))


def region_of(key: str) -> str:
    """The first field of a key: the region of a series or per-region key."""
    return key.split(SEP, 1)[0]


def global_key(key: str) -> str:
    """The roll-up key: the same series with the region replaced by ``global``."""
    return P.GLOBAL_REGION + key[key.index(SEP):]


def timed_key(key: str, time_ms: int) -> str:
    """A key with a window end (or bucket start) in ms appended."""
    return f"{key}{SEP}{time_ms}"


def split_timed_key(key: str) -> tuple[str, int]:
    """``timed_key``'s inverse: (key, ms)."""
    head, time_ms = key.rsplit(SEP, 1)
    return head, int(time_ms)
