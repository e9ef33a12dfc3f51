"""Metric instruments: per-request histograms (every request, whatever the trace sampler decides),
cumulative counters kept in-process and read by observable callbacks, and server gauges.

Names, units and bucket boundaries come from ``infersight.schemas``; buckets are passed as the
``explicit_bucket_boundaries_advisory`` of each histogram (:func:`histogram`; opentelemetry-api 1.30+),
and :func:`views` gives the same as SDK Views for pipelines that want them explicit (and for older APIs,
which take no advisory).
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Iterable, Sequence

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from infersight.schemas import metrics as M
from infersight.schemas import torch_compile as N
from infersight.schemas import triton as T
from infersight.schemas.attributes import ENGINE
from infersight.schemas.registry import get

_log = logging.getLogger("infersight.instrumentation")

HISTOGRAMS = (M.GEN_AI_SERVER_REQUEST_DURATION, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
               M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, M.GEN_AI_CLIENT_TOKEN_USAGE, M.ITL_P99_METRIC,
               M.QUEUE_TIME_METRIC)
# every histogram the instrumentation creates (the per-request ones, the Triton Python backend's, torch.compile's)
ALL_HISTOGRAMS = (*HISTOGRAMS, T.TRITON_EXECUTE_DURATION, T.TRITON_EXECUTE_BATCH, N.COMPILE_DURATION,
                  N.CALL_DURATION)
_ADVISORY = "explicit_bucket_boundaries_advisory"
_takes_advisory: dict[type, bool] = {}  # per meter class: does its create_histogram take the advisory?


def takes_bucket_advisory(meter: Meter) -> bool:
    """Whether ``meter.create_histogram`` takes ``explicit_bucket_boundaries_advisory`` (the API's since
    1.30.0), read from its signature once per meter class."""
    kind = type(meter)
    known = _takes_advisory.get(kind)
    if known is None:
        try:
            known = _ADVISORY in inspect.signature(meter.create_histogram).parameters
        except (TypeError, ValueError):  # no readable signature: do not guess
            known = False
        _takes_advisory[kind] = known
        if not known:
            _log.info("infersight: this OpenTelemetry API (%s) takes no histogram bucket advisory: our histograms "
                      "get the MeterProvider's aggregation (pass views=infersight.instrumentation.views() to it for "
                      "ours; opentelemetry-api 1.30+ needs nothing)", kind.__qualname__)
    return known


def histogram(meter: Meter, name: str, unit: str, description: str, buckets: Sequence[float]):
    """``meter.create_histogram`` with ``buckets`` as the bucket-boundaries advisory where the API takes one."""
    if takes_bucket_advisory(meter):
        return meter.create_histogram(name, unit=unit, description=description,
                                      explicit_bucket_boundaries_advisory=list(buckets))
    return meter.create_histogram(name, unit=unit, description=description)


def _histogram(meter: Meter, name: str):
    entry = get(name)
    return histogram(meter, name, entry.unit, entry.description, entry.buckets)


def views() -> list:
    """SDK Views fixing the registry's bucket boundaries for every histogram the instrumentation creates."""
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    return [View(instrument_name=name,
                 aggregation=ExplicitBucketHistogramAggregation(boundaries=list(get(name).buckets)))
            for name in ALL_HISTOGRAMS]


class RequestMetrics:
    """The per-request histograms. ``record`` takes plain numbers; attributes are pre-built dicts."""

    def __init__(self, meter: Meter) -> None:
        self.duration = _histogram(meter, M.GEN_AI_SERVER_REQUEST_DURATION)
        self.ttft = _histogram(meter, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)
        self.tpot = _histogram(meter, M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN)
        self.tokens = _histogram(meter, M.GEN_AI_CLIENT_TOKEN_USAGE)
        self.itl_p99 = _histogram(meter, M.ITL_P99_METRIC)
        self.queue = _histogram(meter, M.QUEUE_TIME_METRIC)
        self._by_name = {
            M.GEN_AI_SERVER_REQUEST_DURATION: self.duration, M.GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: self.ttft,
            M.GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: self.tpot, M.GEN_AI_CLIENT_TOKEN_USAGE: self.tokens,
            M.ITL_P99_METRIC: self.itl_p99, M.QUEUE_TIME_METRIC: self.queue}

    def series(self, name: str, key: object, attrs: dict) -> tuple:
        """The handle ``record_series`` takes (as ``fastmetrics.HistogramBank.series``)."""
        return self._by_name[name], attrs

    def record_series(self, observations: list[tuple[tuple, float]]) -> None:
        """Record ``(handle from series(), value)`` observations through the API instruments."""
        for (histogram, attrs), value in observations:
            histogram.record(value, attrs)


class ServerGauges:
    """Engine-level state: last value wins for gauges, running totals for prefix-cache counters.

    Setters are plain attribute writes (nanoseconds); the SDK reads them at collection time, so the
    serving path never calls into OpenTelemetry for them.
    """

    def __init__(self, meter: Meter, engine: str) -> None:
        self._attrs = {ENGINE: engine}
        self.queue_depth: int | None = None
        self.running: int | None = None
        self.kv_cache_usage: float | None = None
        self.batch_size: int | None = None
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self._lock = threading.Lock()
        for name, attr in ((M.QUEUE_DEPTH, "queue_depth"), (M.REQUESTS_RUNNING, "running"),
                           (M.KV_CACHE_USAGE, "kv_cache_usage"), (M.BATCH_SIZE, "batch_size")):
            entry = get(name)
            meter.create_observable_gauge(name, callbacks=[self._reader(attr)], unit=entry.unit,
                                          description=entry.description)
        for name, attr in ((M.PREFIX_CACHE_QUERIES, "prefix_cache_queries"),
                           (M.PREFIX_CACHE_HITS, "prefix_cache_hits")):
            entry = get(name)
            meter.create_observable_counter(name, callbacks=[self._reader(attr)], unit=entry.unit,
                                            description=entry.description)

    def _reader(self, attr: str):
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            value = getattr(self, attr)
            return () if value is None else (Observation(value, self._attrs),)

        return observe

    def add_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        with self._lock:
            self.prefix_cache_queries += queried_tokens
            self.prefix_cache_hits += hit_tokens
