"""Self-telemetry: bad input is counted and logged once per kind, never raised into serving code."""

from __future__ import annotations

import logging
import threading

from opentelemetry.metrics import Meter

from infersight.schemas.attributes import INSTRUMENTATION_ERROR_KIND, OTHER_VALUE
from infersight.schemas.metrics import INSTRUMENTATION_ERRORS

_log = logging.getLogger("infersight.instrumentation")

# The fixed set of kinds (bounded cardinality on the counter).
BAD_TYPE = "bad_type"
NEGATIVE_VALUE = "negative_value"
NEGATIVE_DURATION = "negative_duration"
TOKEN_BEFORE_FIRST_TOKEN = "token_before_first_token"
TOKEN_OUTSIDE_REQUEST = "token_outside_request"
NOT_STARTED = "not_started"
DOUBLE_FINISH = "double_finish"
DOUBLE_START = "double_start"
STAGE_NOT_OPEN = "stage_not_open"
STAGE_LEFT_OPEN = "stage_left_open"
UNKNOWN_STAGE = "unknown_stage"
UNKNOWN_VALUE = "unknown_value"
AFTER_FINISH = "after_finish"
REDACTION_FAILED = "redaction_failed"
INTERNAL = "internal_error"
CARDINALITY_OVERFLOW = "cardinality_overflow"  # a metric label value past its bound, recorded as _OTHER
KINDS = (BAD_TYPE, NEGATIVE_VALUE, NEGATIVE_DURATION, TOKEN_BEFORE_FIRST_TOKEN, TOKEN_OUTSIDE_REQUEST,
         NOT_STARTED, DOUBLE_FINISH, DOUBLE_START, STAGE_NOT_OPEN, STAGE_LEFT_OPEN, UNKNOWN_STAGE,
         UNKNOWN_VALUE, AFTER_FINISH, REDACTION_FAILED, INTERNAL, CARDINALITY_OVERFLOW)


class SelfTelemetry:
    def __init__(self, meter: Meter) -> None:
        self._counter = meter.create_counter(
            INSTRUMENTATION_ERRORS, unit="{error}",
            description="Bad input seen by infersight's instrumentation (never raised into serving code)")
        self._attrs = {kind: {INSTRUMENTATION_ERROR_KIND: kind} for kind in KINDS}
        self._logged: set[str | tuple[str, str]] = set()
        self._lock = threading.Lock()

    def bad_input(self, kind: str, detail: str) -> None:
        """Count one bad input of ``kind``; log the first of each kind with ``detail``. Never raises."""
        try:
            self._counter.add(1, self._attrs.get(kind) or self._attrs[INTERNAL])
            with self._lock:
                first = kind not in self._logged
                self._logged.add(kind)
            if first:
                _log.warning("infersight: ignored bad instrumentation input (%s): %s. Further %s inputs are "
                             "only counted on %s.", kind, detail, kind, INSTRUMENTATION_ERRORS)
        except Exception:  # noqa: BLE001 - self-telemetry must never break serving
            pass

    def folded(self, label: str, value: str, limit: int, period_s: float, setting: str) -> None:
        """Count one metric label value recorded as ``_OTHER`` (kind ``cardinality_overflow``); log the first
        of each label, with the value, the bound and the setting that raises it. Never raises."""
        try:
            self._counter.add(1, self._attrs[CARDINALITY_OVERFLOW])
            with self._lock:
                first = (CARDINALITY_OVERFLOW, label) not in self._logged
                self._logged.add((CARDINALITY_OVERFLOW, label))
            if first:
                _log.warning("infersight: more than %d distinct %s values within %g s; %r and every further new "
                             "value until the period ends are recorded on metrics as %s (spans keep the real "
                             "value). Raise the bound with %s if this pod really serves that many. Further ones are "
                             "only counted on %s{%s=%s}.", limit, label, period_s, value[:200], OTHER_VALUE,
                             setting, INSTRUMENTATION_ERRORS, INSTRUMENTATION_ERROR_KIND, CARDINALITY_OVERFLOW)
        except Exception:  # noqa: BLE001 - self-telemetry must never break serving
            pass
