"""Configuration from the environment: ours (``INFERSIGHT_*``) next to the standard ``OTEL_*`` ones.

The OpenTelemetry SDK reads ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``
and the exporter variables itself; we add region, deployment track, model version, content capture and the
bounds on metric label values that come from requests (``cardinality``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infersight.schemas.attributes import (
    CLOUD_REGION,
    DEPLOYMENT_TRACK,
    MODEL_VERSION,
    TRACKS,
)

ENV_REGION = "INFERSIGHT_REGION"
ENV_DEPLOYMENT_TRACK = "INFERSIGHT_DEPLOYMENT_TRACK"
ENV_MODEL_VERSION = "INFERSIGHT_MODEL_VERSION"
ENV_REQUEST_RECORDS = "INFERSIGHT_REQUEST_RECORDS"  # "false": no record-only root span for sampled-out traces
ENV_CAPTURE_CONTENT = "INFERSIGHT_CAPTURE_CONTENT"
# The OpenTelemetry GenAI instrumentations' switch for message content; honoured too.
ENV_OTEL_CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
# Per-label bounds on metric attribute values that requests supply (distinct values per period; see cardinality)
ENV_MAX_MODELS = "INFERSIGHT_METRIC_MAX_MODELS"
ENV_MAX_ERROR_TYPES = "INFERSIGHT_METRIC_MAX_ERROR_TYPES"
ENV_CARDINALITY_PERIOD = "INFERSIGHT_METRIC_CARDINALITY_PERIOD_S"

_log = logging.getLogger("infersight.instrumentation")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    region: str = ""
    track: str = "stable"
    model_version: str = ""
    capture_content: bool = False
    request_records: bool = True
    # metric label values from requests: at most this many distinct ones per period, later ones become _OTHER
    # (a pod serves one or a few models; error types are exception classes and error codes)
    max_models: int = 100
    max_error_types: int = 50
    cardinality_period_s: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("max_models", "max_error_types"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"Settings.{name} must be a positive integer, got {value!r}")
        period = self.cardinality_period_s
        if not isinstance(period, int | float) or isinstance(period, bool) or not 0 < period < float("inf"):
            raise ValueError(f"Settings.cardinality_period_s must be a positive number of seconds, got {period!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        track = env.get(ENV_DEPLOYMENT_TRACK, "stable").strip().lower() or "stable"
        if track not in TRACKS:
            _log.warning("%s=%r is not one of %s; using 'stable'. Set it to the rollout track of this pod.",
                         ENV_DEPLOYMENT_TRACK, track, ", ".join(TRACKS))
            track = "stable"
        capture = (env.get(ENV_CAPTURE_CONTENT, "") or env.get(ENV_OTEL_CAPTURE_CONTENT, "")).strip().lower()
        return cls(region=env.get(ENV_REGION, "").strip(), track=track,
                   model_version=env.get(ENV_MODEL_VERSION, "").strip(), capture_content=capture in _TRUE,
                   request_records=env.get(ENV_REQUEST_RECORDS, "true").strip().lower() not in _FALSE,
                   max_models=_positive(env, ENV_MAX_MODELS, cls.max_models, int),
                   max_error_types=_positive(env, ENV_MAX_ERROR_TYPES, cls.max_error_types, int),
                   cardinality_period_s=_positive(env, ENV_CARDINALITY_PERIOD, cls.cardinality_period_s, float))

    def resource_attributes(self) -> dict[str, str]:
        """Attributes to merge into the SDK ``Resource`` (region, track, model version when set)."""
        attrs = {DEPLOYMENT_TRACK: self.track}
        if self.region:
            attrs[CLOUD_REGION] = self.region
        if self.model_version:
            attrs[MODEL_VERSION] = self.model_version
        return attrs


def _positive(env: Mapping[str, str], name: str, default: int | float, kind: type) -> Any:
    """``env[name]`` as a positive ``kind`` (int or float); unset: ``default``; anything else: one WARNING and
    ``default``."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not 0 < value < float("inf"):
        _log.warning("%s=%r is not a positive %s; using %s.", name, raw, "integer" if kind is int else "number",
                     default)
        return default
    return value


def build_resource(settings: Settings | None = None):  # -> opentelemetry.sdk.resources.Resource
    """An SDK resource with our attributes, merged with OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME."""
    from opentelemetry.sdk.resources import Resource

    return Resource.create((settings or Settings.from_env()).resource_attributes())
