"""Building OTLP metric batches (``ExportMetricsServiceRequest``) for the sink collector.

The jobs write protobuf directly with opentelemetry-proto: the SDK's MeterProvider aggregates over
wall-clock intervals and cannot stamp a point with a window's event time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, Metric

SCOPE = "infersight.flink_jobs"


def _attributes(labels: Mapping[str, str]) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in labels.items()]


class MetricsBatch:
    """One OTLP request; every point carries its labels as data-point attributes."""

    def __init__(self, job: str) -> None:
        self.request = ExportMetricsServiceRequest()
        rm = self.request.resource_metrics.add()
        rm.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value=job)))
        self._scope = rm.scope_metrics.add()
        self._scope.scope.name = SCOPE
        self._metrics: dict[tuple[str, str], Metric] = {}

    def _metric(self, name: str, unit: str, kind: str) -> Metric:
        metric = self._metrics.get((name, kind))
        if metric is None:
            metric = self._scope.metrics.add()
            metric.name, metric.unit = name, unit
            if kind == "sum":
                metric.sum.is_monotonic = True
                metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            elif kind == "histogram":
                metric.histogram.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            elif kind == "exponential":
                metric.exponential_histogram.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            else:
                metric.gauge.SetInParent()
            self._metrics[(name, kind)] = metric
        return metric

    def gauge(self, name: str, unit: str, labels: Mapping[str, str], value: float, time_ns: int) -> None:
        point = self._metric(name, unit, "gauge").gauge.data_points.add()
        point.attributes.extend(_attributes(labels))
        point.as_double, point.time_unix_nano = float(value), time_ns

    def counter(self, name: str, unit: str, labels: Mapping[str, str], value: float, start_ns: int,
                time_ns: int) -> None:
        point = self._metric(name, unit, "sum").sum.data_points.add()
        point.attributes.extend(_attributes(labels))
        point.as_double, point.start_time_unix_nano, point.time_unix_nano = float(value), start_ns, time_ns

    def histogram(self, name: str, unit: str, labels: Mapping[str, str], bounds: Sequence[float],
                  counts: Iterable[int], total: float, start_ns: int, time_ns: int) -> None:
        point = self._metric(name, unit, "histogram").histogram.data_points.add()
        point.attributes.extend(_attributes(labels))
        point.explicit_bounds.extend(bounds)
        point.bucket_counts.extend(counts)
        point.count = sum(point.bucket_counts)
        point.sum = total
        point.start_time_unix_nano, point.time_unix_nano = start_ns, time_ns

    def exponential_histogram(self, name: str, unit: str, labels: Mapping[str, str], scale: int, zero_count: int,
                              offset: int, counts: Sequence[int], total: float, start_ns: int,
                              time_ns: int) -> None:
        """The same distribution as exponential buckets (the exporter writes a native histogram of that name,
        beside the explicit one's _bucket/_sum/_count series)."""
        point = self._metric(name, unit, "exponential").exponential_histogram.data_points.add()
        point.attributes.extend(_attributes(labels))
        point.scale, point.zero_count = scale, zero_count
        point.positive.offset = offset
        point.positive.bucket_counts.extend(counts)
        point.count = zero_count + sum(counts)
        point.sum = total
        point.start_time_unix_nano, point.time_unix_nano = start_ns, time_ns

    def __len__(self) -> int:
        return sum(len(getattr(m, m.WhichOneof("data")).data_points) for m in self._scope.metrics)

    def serialize(self) -> bytes:
        return self.request.SerializeToString()
