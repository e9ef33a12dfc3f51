"""Event-time window arithmetic shared by the jobs: tumbling windows aligned to the epoch, as Flink's
``TumblingEventTimeWindows`` (offset 0) assigns them. Times in, integer milliseconds out."""

from __future__ import annotations

from infersight.schemas.units import MS


def window_start_ms(time_ms: int, window_ms: int) -> int:
    """Start of the tumbling window (``window_ms`` long) holding ``time_ms``."""
    return time_ms - time_ms % window_ms


def window_end_ms(time_ms: int, window_ms: int) -> int:
    """End (exclusive) of the tumbling window holding ``time_ms``."""
    return (time_ms // window_ms + 1) * window_ms


def window_end_of_ns(time_ns: int, window_ms: int) -> int:
    """``window_end_ms`` of a time in nanoseconds (a record's ``end_ns``, a gauge's ``time_ns``)."""
    return (time_ns // MS // window_ms + 1) * window_ms


def fired(window_end: int, watermark_ms: int) -> bool:
    """Whether a window ending at ``window_end`` ms has fired at this watermark: Flink's rule (a window's
    last millisecond is at or before the watermark). An element of a fired window is late."""
    return window_end - 1 <= watermark_ms
