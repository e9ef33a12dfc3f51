"""Per-request histograms aggregated in-process, exported through the SDK's own metric readers.

The SDK's synchronous ``Histogram.record`` costs 5-30 µs per call (attribute validation, hashing,
exemplar filter, locking), which is more than a whole request may spend on telemetry. Here a request's
observations are bucketed under one lock with ``bisect`` (about a microsecond each) into fixed
explicit-bucket histograms taken from the registry; when any reader of the ``MeterProvider`` collects,
the points are appended to what the SDK collected, as ordinary ``Histogram`` metrics of our
instrumentation scope, in the temporality the reader asked for. Exporters (OTLP, Prometheus,
in-memory) see no difference.

Cardinality: as the SDK does for its own streams, each metric keeps at most ``limit`` attribute sets (the
SDK's default of 2,000, or the smallest histogram limit the provider's readers and views configure); a
measurement with a further set goes into one more point whose only attribute is ``otel.metric.overflow=true``
(logged once per metric). Sets are counted since start, as a cumulative stream counts them; no key past the
limit is kept, so memory stays bounded whatever the attributes.

The bridge relies on SDK internals (the provider's measurement consumer and its reader storages, the
readers' collect callback and temporality table, the provider's resource, the SDK's histogram instrument
class), all present from opentelemetry-sdk 1.27 to the pinned version; :func:`bank_for` checks each by
feature detection (never by version number) and returns None when one is absent, and the caller then falls
back to the API instruments.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from typing import Any

from infersight.schemas.attributes import OTEL_METRIC_OVERFLOW
from infersight.schemas.registry import get

_log = logging.getLogger("infersight.instrumentation")
_BANKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BANKS_LOCK = threading.Lock()
DEFAULT_CARDINALITY_LIMIT = 2000  # the SDK's default per metric stream (its _DEFAULT_CARDINALITY_LIMIT)
_OVERFLOW_KEY = object()  # the overflow series' key: equal to no attribute-set key


def _new_point(n_buckets: int, attrs: dict, name: str) -> list:
    """[bucket counts, sum, min, max, attributes, metric name]; the count is the buckets' sum, taken at
    collection (one update less per observation)."""
    return [[0] * n_buckets, 0.0, float("inf"), float("-inf"), attrs, name]


def _add(point: list, index: int, value: float) -> None:
    point[0][index] += 1
    point[1] += value
    if value < point[2]:
        point[2] = value
    if value > point[3]:
        point[3] = value


class HistogramBank:
    """Cumulative points per (metric, attribute set), plus a delta view per delta-temporality reader."""

    def __init__(self, names: Sequence[str], scope_name: str, scope_version: str,
                 limits: dict[str, int] | None = None) -> None:
        self._spec = {}
        for name in names:
            entry = get(name)
            self._spec[name] = (entry.buckets, len(entry.buckets) + 1, entry.unit, entry.description)
        self.scope_name, self.scope_version = scope_name, scope_version
        # attribute sets per metric before the overflow series (``limits``: per name, else the SDK's default)
        self.limits = {name: (limits or {}).get(name, DEFAULT_CARDINALITY_LIMIT) for name in names}
        self._sets = dict.fromkeys(names, 0)  # attribute sets per metric so far (the overflow series not counted)
        self._series: dict[tuple, tuple] = {}  # (metric name, attribute-set key) -> handle
        self._cumulative: dict[int, list] = {}  # series number -> point
        self._deltas: dict[int, dict[int, list]] = {}  # id(reader) -> points since its last collect
        self._delta_targets: tuple[dict, ...] = ()  # rebuilt when _deltas changes, not per record
        self._delta_start: dict[int, int] = {}
        self._start_ns = time.time_ns()
        self._lock = threading.Lock()

    def series(self, name: str, key: Any, attrs: dict) -> tuple:
        """The handle ``record_series`` takes for metric ``name`` with these attributes (``key`` names the
        set): buckets, point number and cumulative point resolved once, since hashing nested key tuples
        on every record cost more than the bucketing. (A series' cumulative point exists from here on;
        collection skips it until it counts something.) Past the metric's limit of attribute sets, the
        overflow series' handle, and the key is not kept."""
        handle = self._series.get((name, key))
        if handle is None:
            with self._lock:
                handle = self._series.get((name, key))
                if handle is None:
                    if self._sets[name] < self.limits[name]:
                        self._sets[name] += 1
                        handle = self._new_series(name, key, attrs)
                    else:
                        handle = self._series.get((name, _OVERFLOW_KEY))
                        if handle is None:
                            handle = self._new_series(name, _OVERFLOW_KEY, {OTEL_METRIC_OVERFLOW: True})
                            _log.warning("infersight: %s reached its cardinality limit of %d attribute sets; further "
                                         "sets are recorded in one series with only %s=true (the OpenTelemetry "
                                         "SDK's overflow series)", name, self.limits[name], OTEL_METRIC_OVERFLOW)
        return handle

    def _new_series(self, name: str, key: Any, attrs: dict) -> tuple:
        """A new series' handle and cumulative point (under the lock)."""
        bounds, n_buckets, _unit, _desc = self._spec[name]
        number = len(self._series)
        point = self._cumulative[number] = _new_point(n_buckets, attrs, name)
        handle = self._series[(name, key)] = (bounds, n_buckets, number, attrs, name, point)
        return handle

    def record_series(self, observations: Iterable[tuple[tuple, float]]) -> None:
        """Record ``(handle from series(), value)`` observations under one lock."""
        with self._lock:
            deltas = self._delta_targets  # each delta reader's points (usually none)
            for handle, value in observations:
                index = bisect_left(handle[0], value)
                point = handle[5]
                point[0][index] += 1  # _add, inlined for the cumulative point (every observation)
                point[1] += value
                if value < point[2]:
                    point[2] = value
                if value > point[3]:
                    point[3] = value
                if deltas:
                    self._add_deltas(deltas, handle, index, value)

    @staticmethod
    def _add_deltas(deltas: tuple[dict, ...], handle: tuple, index: int, value: float) -> None:
        _bounds, n_buckets, number, attrs, name, _point = handle
        for points in deltas:
            delta = points.get(number)
            if delta is None:
                delta = points[number] = _new_point(n_buckets, attrs, name)
            _add(delta, index, value)

    def _retarget(self) -> None:
        """After ``_deltas`` changes (under the lock): the delta points ``record_series`` updates, built
        once, not per call."""
        self._delta_targets = tuple(self._deltas.values())

    def collect(self, reader: Any) -> list:
        """SDK ``Metric`` objects for ``reader`` in its histogram temporality."""
        from opentelemetry.sdk.metrics.export import AggregationTemporality, Histogram, HistogramDataPoint, Metric

        temporality = getattr(reader, "_instrument_class_temporality", {}).get(
            _sdk_histogram_class(), AggregationTemporality.CUMULATIVE)
        now = time.time_ns()
        with self._lock:
            if temporality is AggregationTemporality.DELTA:
                rid = id(reader)
                points = self._deltas.get(rid, {})
                start = self._delta_start.get(rid, self._start_ns)
                self._deltas[rid], self._delta_start[rid] = {}, now
                self._retarget()
            else:
                points, start = self._cumulative, self._start_ns
            snapshot = [(p[5], list(p[0]), p[1], p[2], p[3], p[4]) for p in points.values() if any(p[0])]
        by_name: dict[str, list] = {}
        for name, counts, total, low, high, attrs in snapshot:
            bounds = self._spec[name][0]
            by_name.setdefault(name, []).append(HistogramDataPoint(
                attributes=attrs, start_time_unix_nano=start, time_unix_nano=now, count=sum(counts), sum=total,
                bucket_counts=counts, explicit_bounds=list(bounds), min=low, max=high))
        return [Metric(name=name, description=self._spec[name][3], unit=self._spec[name][2],
                       data=Histogram(data_points=points_, aggregation_temporality=temporality))
                for name, points_ in by_name.items()]

    def merge_into(self, data: Any, reader: Any, resource: Any) -> Any:
        """``data`` (the SDK's MetricsData, or None) with our metrics appended under our scope."""
        from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        ours = self.collect(reader)
        if not ours:
            return data
        resource_metrics = list(data.resource_metrics) if data is not None else []
        if not resource_metrics:
            resource_metrics = [ResourceMetrics(resource=resource, scope_metrics=[], schema_url="")]
        first = resource_metrics[0]
        scopes = list(first.scope_metrics)
        for i, scope_metrics in enumerate(scopes):
            if scope_metrics.scope.name == self.scope_name:
                scopes[i] = ScopeMetrics(scope_metrics.scope, [*scope_metrics.metrics, *ours],
                                         scope_metrics.schema_url)
                break
        else:
            scopes.append(ScopeMetrics(InstrumentationScope(self.scope_name, self.scope_version), ours, ""))
        resource_metrics[0] = ResourceMetrics(first.resource, scopes, first.schema_url)
        return MetricsData(resource_metrics=resource_metrics)

    def register_delta_reader(self, reader: Any) -> None:
        from opentelemetry.sdk.metrics.export import AggregationTemporality

        temporality = getattr(reader, "_instrument_class_temporality", {}).get(_sdk_histogram_class())
        if temporality is AggregationTemporality.DELTA:
            with self._lock:
                self._deltas.setdefault(id(reader), {})
                self._delta_start.setdefault(id(reader), time.time_ns())
                self._retarget()


def _sdk_histogram_class() -> type:
    from opentelemetry.sdk.metrics._internal.instrument import _Histogram

    return _Histogram


def bank_for(meter_provider: Any, names: Sequence[str], scope_name: str, scope_version: str
             ) -> HistogramBank | None:
    """The provider's bank (one per SDK MeterProvider, shared by every Instrumentation), or None."""
    try:
        from opentelemetry.sdk.metrics import MeterProvider
    except ImportError:
        return None
    if not isinstance(meter_provider, MeterProvider):
        return None
    consumer = getattr(meter_provider, "_measurement_consumer", None)
    storages = getattr(consumer, "_reader_storages", None)
    resource = getattr(getattr(meter_provider, "_sdk_config", None), "resource", None)
    if consumer is None or storages is None or not hasattr(consumer, "collect") or resource is None:
        return None
    if not all(hasattr(reader, "_set_collect_callback") for reader in list(storages)):
        return None
    try:
        _sdk_histogram_class()
    except (ImportError, AttributeError):  # the SDK's histogram class moved: temporality cannot be read
        return None
    with _BANKS_LOCK:
        bank = _BANKS.get(meter_provider)
        if bank is not None:
            return bank
        views = getattr(meter_provider._sdk_config, "views", ())  # noqa: SLF001
        bank = HistogramBank(names, scope_name, scope_version,
                             {name: cardinality_limit(name, list(storages), views, scope_name, scope_version)
                              for name in names})
        sdk_collect = consumer.collect

        def collect(reader: Any, timeout_millis: float = 10_000) -> Any:
            return bank.merge_into(sdk_collect(reader, timeout_millis=timeout_millis), reader, resource)

        consumer.collect = collect  # readers added later get the bridged callback too
        for reader in list(storages):
            bank.register_delta_reader(reader)
            reader._set_collect_callback(collect)  # noqa: SLF001
        _BANKS[meter_provider] = bank
        return bank


def cardinality_limit(name: str, readers: Sequence[Any], views: Sequence[Any], scope_name: str,
                      scope_version: str) -> int:
    """The attribute sets the SDK would keep for histogram ``name`` of our scope, the smallest over its
    streams (the bank's one series set stands for all of them): per reader, one stream per view that selects
    the histogram (none: one stream), each limited by its view's ``aggregation_cardinality_limit``, else by
    the reader's histogram limit (``MetricReader(cardinality_limits=...)``), else the SDK's default. Read by
    feature detection: an SDK without cardinality limits (the older ones) gives the default."""
    try:
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        probe = object.__new__(_sdk_histogram_class())  # what View._match reads of an instrument, nothing else
        probe.name, probe.unit = name.lower(), get(name).unit
        probe.instrumentation_scope = InstrumentationScope(scope_name, scope_version)
    except Exception:  # noqa: BLE001 - no probe: no view is taken to select the histogram
        probe = None
    selecting = []  # the limit (or None) of each view that selects the histogram
    for view in views if probe is not None else ():
        try:
            if view._match(probe):  # noqa: SLF001
                selecting.append(getattr(view, "_aggregation_cardinality_limit", None))
        except Exception:  # noqa: BLE001 - a view we cannot evaluate is taken not to select it
            pass
    limits = []
    for reader in readers:
        by_class = getattr(reader, "_instrument_class_cardinality_limit", None)
        limit = by_class.get(_sdk_histogram_class()) if isinstance(by_class, dict) else None
        reader_limit = limit if _positive_int(limit) else DEFAULT_CARDINALITY_LIMIT
        limits.append(min((v if _positive_int(v) else reader_limit for v in selecting), default=reader_limit))
    return min(limits, default=DEFAULT_CARDINALITY_LIMIT)


def _positive_int(value: Any) -> bool:
    return type(value) is int and value > 0
