"""OTLP metrics from pods -> per-pod gauge records (the ones ``schemas.pipeline.POD_GAUGES`` rolls up), each
with the pod's deployment: region, model, model version and track.

Pure: no Flink. Other metrics on the topic (the pods' own histograms, counters) are skipped, not
dead-lettered: the metrics job computes those distributions from request records instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from infersight.flink_jobs.normalize.otlp_spans import any_value
from infersight.flink_jobs.normalize.span_records import MAX_DIMENSION_CHARS, TimeBounds
from infersight.schemas import attributes as A
from infersight.schemas.pipeline import (
    GPU_COUNT_ATTRIBUTE,
    GPU_TYPE_ATTRIBUTE,
    POD_GAUGE_ALIASES,
    POD_GAUGE_STATS,
    POD_MODEL_ATTRIBUTE,
)
from infersight.schemas.records import INT64_MAX
from infersight.schemas.units import NS


def _pod(resource: dict[str, Any]) -> str:
    for key in (A.K8S_POD_NAME, "service.instance.id", "host.name"):
        value = resource.get(key)
        if isinstance(value, str) and value:
            return value
    return str(resource.get(A.SERVICE_NAME) or "unknown")


def _dimension(resource: dict[str, Any], key: str, default: str) -> str | None:
    """A resource attribute that becomes a metric label: a short string (``default`` when absent), or None."""
    value = resource.get(key)
    if value is None or value == "":
        return default
    return value if isinstance(value, str) and len(value) <= MAX_DIMENSION_CHARS else None


def _deployment(resource: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """The pod's model, model version and track (as its requests': version "", track "stable" when unset),
    and a problem when one is not a short string or the track is not one of the contract's."""
    dims = {"model": _dimension(resource, POD_MODEL_ATTRIBUTE, ""),
            "model_version": _dimension(resource, A.MODEL_VERSION, ""),
            "track": _dimension(resource, A.DEPLOYMENT_TRACK, "stable")}
    keys = {"model": POD_MODEL_ATTRIBUTE, "model_version": A.MODEL_VERSION, "track": A.DEPLOYMENT_TRACK}
    for field, value in dims.items():
        if value is None:
            return {}, f"{keys[field]}: not a string of at most {MAX_DIMENSION_CHARS} characters on the resource"
    if dims["track"] not in A.TRACKS:
        return {}, f"{A.DEPLOYMENT_TRACK}: unknown track {dims['track']!r} (known: {', '.join(A.TRACKS)})"
    return dims, None  # type: ignore[return-value]


def gauges_from_payload(payload: bytes, now_ns: int | None = None, bounds: TimeBounds | None = None
                        ) -> Iterator[dict[str, Any] | str]:
    """One dict per pod gauge data point, or a problem string for a point that breaks the contract: a value
    that is not finite (JSON has no NaN: it became null downstream), a time past int64, or, given the
    normaliser's clock ``now_ns``, a time further from it than ``bounds`` allow (as for spans).

    Raises ``google.protobuf.message.DecodeError`` when the bytes are not an OTLP metrics request."""
    lo, hi = 1, INT64_MAX
    if now_ns is not None:
        bounds = bounds or TimeBounds()
        lo = max(lo, now_ns - int(bounds.max_age_s * NS))
        hi = min(hi, now_ns + int(bounds.max_future_s * NS))
    request = ExportMetricsServiceRequest.FromString(payload)
    for rm in request.resource_metrics:
        resource = {kv.key: any_value(kv.value) for kv in rm.resource.attributes}
        region = resource.get(A.CLOUD_REGION)
        pod = _pod(resource)
        gpu_type = str(resource.get(GPU_TYPE_ATTRIBUTE) or "")
        gpu_count = resource.get(GPU_COUNT_ATTRIBUTE)
        gpu_count = gpu_count if isinstance(gpu_count, int) and not isinstance(gpu_count, bool) else 0
        deployment, problem = _deployment(resource)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                name = POD_GAUGE_ALIASES.get(metric.name, metric.name)
                if name not in POD_GAUGE_STATS:
                    continue
                kind = metric.WhichOneof("data")
                if kind not in ("gauge", "sum"):
                    yield f"{metric.name}: expected a gauge or sum, got {kind}"
                    continue
                if not isinstance(region, str) or not region:
                    yield f"{A.CLOUD_REGION}: missing on the resource of {metric.name}"
                    continue
                if problem is not None:
                    yield f"{problem} ({metric.name})"
                    continue
                for point in getattr(metric, kind).data_points:
                    value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                    if point.time_unix_nano == 0:
                        yield f"{metric.name}: data point without time_unix_nano"
                        continue
                    if not lo <= point.time_unix_nano <= hi:
                        yield (f"time_unix_nano: {point.time_unix_nano} of {metric.name} is outside the accepted "
                               f"range [{lo}, {hi}]")
                        continue
                    if not math.isfinite(value):
                        yield f"{metric.name}: value {value} is not finite"
                        continue
                    hw_id = next((any_value(kv.value) for kv in point.attributes if kv.key == A.HW_ID), None)
                    yield {"region": region, **deployment, "pod": pod if hw_id is None else f"{pod}/{hw_id}",
                           "metric": name,
                           "value": float(value), "time_ns": point.time_unix_nano, "gpu_type": gpu_type,
                           "gpu_count": gpu_count, "engine": str(resource.get(A.ENGINE) or "")}
