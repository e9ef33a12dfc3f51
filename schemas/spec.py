"""The shape of one registry entry: what a telemetry name is, where it comes from, how it is typed."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    RESOURCE = "resource attribute"
    SPAN = "span attribute"
    EVENT_ATTRIBUTE = "event attribute"
    METRIC = "metric"
    EVENT = "event"


class Source(StrEnum):
    SEMCONV = "semconv"        # OpenTelemetry semantic conventions (GenAI, resource, hardware, error)
    VLLM = "vllm"              # vLLM's own names, understood on input
    TRITON = "triton"          # Triton Inference Server's own names, understood on input
    INFERSIGHT = "infersight"  # ours, only where no convention exists


class Instrument(StrEnum):
    HISTOGRAM = "histogram"
    COUNTER = "counter"
    GAUGE = "observable gauge"
    UP_DOWN_COUNTER = "up-down counter"


@dataclass(frozen=True)
class Entry:
    """One attribute, metric or event name of the contract.

    ``emitted`` is False for names we only read (another engine's spelling); ``maps_to`` then names the
    entry it is normalised into. ``metric_dimension`` marks attributes put on metric points, whose
    cardinality must stay bounded.
    """

    name: str
    kind: Kind
    type: str
    source: Source
    description: str
    unit: str = ""
    cardinality: str = ""
    instrument: Instrument | None = None
    buckets: tuple[float, ...] = ()
    buckets_why: str = ""
    metric_dimension: bool = False
    emitted: bool = True
    maps_to: str = ""
    deprecated: bool = False

    def __post_init__(self) -> None:
        if self.kind is Kind.METRIC and self.instrument is None:
            raise ValueError(f"metric {self.name!r} needs an instrument type")
        if self.buckets and list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"bucket boundaries of {self.name!r} must be strictly increasing")
        if self.source is Source.INFERSIGHT and not self.name.startswith("infersight."):
            raise ValueError(f"our own names live under infersight.*: {self.name!r}")
