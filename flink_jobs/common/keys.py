"""String keys of keyed streams: fields joined by an ASCII unit separator (never in a label value the
contract allows), and a time in milliseconds appended for per-window (or per-bucket) keys. Request series
(``series_key``) and deployments (``deployment_key``: pod gauges and cost) with their roll-ups."""

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


# ---- deployments: the key of pod gauges and cost (a request series without its engine) ----
_ALL = SEP.join((P.ALL_DEPLOYMENTS,) * (len(P.DEPLOYMENT_LABELS) - 1))


def deployment_key(record: Mapping[str, Any]) -> str:
    """A pod gauge point's (or request record's) deployment: region, model, model version, track
    (``P.DEPLOYMENT_LABELS``, in order; defaults as ``series_key``'s)."""
    return SEP.join((record["region"], record.get("model") or "", record.get("model_version") or "",
                     record.get("track") or "stable"))


def deployment_of_series(key: str) -> str:
    """The deployment of a request series key (its engine dropped)."""
    return key.rsplit(SEP, 1)[0]


def deployment_rollups(key: str) -> tuple[str, str, str, str]:
    """The four keys a deployment's data counts in: itself, its region's roll-up over deployments, the same
    deployment over regions (``region="global"``), and everything."""
    region, rest = key.split(SEP, 1)
    return key, f"{region}{SEP}{_ALL}", f"{P.GLOBAL_REGION}{SEP}{rest}", f"{P.GLOBAL_REGION}{SEP}{_ALL}"


def deployment_labels(key: str) -> dict[str, str]:
    """A deployment key (or a roll-up's) as its metric labels."""
    return dict(zip(P.DEPLOYMENT_LABELS, key.split(SEP), strict=True))
