"""String keys of keyed streams: fields joined by an ASCII unit separator, and a time in milliseconds appended
for per-window (or per-bucket) keys. Request series (``series_key``) and deployments (``deployment_key``: pod
gauges and cost) with their roll-ups.

Label values are free-form text from pods, so a field may hold the separator itself: such a key is built with
every field escaped (``ESC`` becomes ``ESC 0``, ``SEP`` becomes ``ESC 1``), so a key always has exactly one
field per label and ``labels_of``/``deployment_labels`` give back the values exactly. A key whose fields hold
neither character (every value the contract's own names use) is the plain join, as before, found with one scan
of the joined key; only a key holding ``ESC`` is unescaped when read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infersight.schemas import pipeline as P

SEP = "\x1f"
ESC = "\x1e"  # the escape of a field holding SEP or ESC (ASCII record separator)
_ESCAPED_ESC, _ESCAPED_SEP = ESC + "0", ESC + "1"


def _escape(value: str) -> str:
    return value.replace(ESC, _ESCAPED_ESC).replace(SEP, _ESCAPED_SEP)


def _unescape(value: str) -> str:
    """``_escape``'s inverse: every ESC in an escaped field starts a pair, so ESC 1 is always an escaped SEP."""
    return value.replace(_ESCAPED_SEP, SEP).replace(_ESCAPED_ESC, ESC)


def join_fields(fields: tuple[str, ...]) -> str:
    """Fields as one key: the plain join, or, where a field holds SEP or ESC, the join of escaped fields."""
    key = SEP.join(fields)
    if ESC in key or key.count(SEP) != len(fields) - 1:  # rare: a value holding the separator (or the escape)
        key = SEP.join(map(_escape, fields))
    return key


def split_fields(key: str, maxsplit: int = -1) -> list[str]:
    """``join_fields``'s inverse (``maxsplit`` as ``str.split``'s: the rest of the key stays escaped)."""
    fields = key.split(SEP, maxsplit)
    if ESC in key:
        unescape = fields if maxsplit < 0 else fields[:maxsplit]
        fields[:len(unescape)] = map(_unescape, unescape)
    return fields


def series_key(record: Mapping[str, Any]) -> str:
    """A request record's series: region, model, model version, track, engine (``P.SERIES_LABELS``, in order;
    bounded label values)."""
    return join_fields((record["region"], record["model"], record.get("model_version") or "",
                        record.get("track") or "stable", record.get("engine") or "custom"))


def labels_of(key: str) -> dict[str, str]:
    """A series key as its metric labels."""
    return dict(zip(P.SERIES_LABELS, split_fields(key), strict=True))


def region_of(key: str) -> str:
    """The first field of a key: the region of a series or per-region key."""
    region = key.split(SEP, 1)[0]
    return _unescape(region) if ESC in region else region


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
    return join_fields((record["region"], record.get("model") or "", record.get("model_version") or "",
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
    return dict(zip(P.DEPLOYMENT_LABELS, split_fields(key), strict=True))
