"""The per-request record: one flat row per inference request, used downstream of the normaliser.

``validate`` returns every contract violation, each naming its field, so the dead-letter topic can say
exactly what was wrong; it never raises on bad input.
"""

from __future__ import annotations

import math
import re
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from infersight.schemas.attributes import TRACKS
from infersight.schemas.contract import COUNT_FIELDS, DURATION_FIELDS, REQUEST_FIELDS
from infersight.schemas.units import NS

FINISH_REASONS = ("stop", "length", "abort", "error", "content_filter", "tool_calls")
SLACK_S = 1e-6  # float rounding between stage sums and the end-to-end duration
INT64_MAX = 2**63 - 1  # integers are int64 downstream (Arrow, Parquet, Kafka timestamps); JSON readers take more


@dataclass(slots=True)
class RequestRecord:
    trace_id: str
    region: str
    model: str
    start_ns: int
    end_ns: int
    e2e_s: float
    span_id: str = ""  # the request span's id: with trace_id, the request's identity (a trace may hold many)
    model_version: str = ""
    track: str = "stable"
    engine: str = "custom"
    ttft_s: float | None = None
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    itl_count: int = 0
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p90_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_cached: int = 0
    finish_reason: str | None = None
    error_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # Flat fields only: a comprehension, not dataclasses.asdict (its recursive deep copy cost the
        # normalize job ~60 % of its CPU per record).
        return {name: getattr(self, name) for name in RECORD_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
if RECORD_FIELDS != tuple(f.name for f in REQUEST_FIELDS):  # one contract: the dataclass and the table agree
    raise ImportError("schemas.records.RequestRecord and schemas.contract.REQUEST_FIELDS name different fields")
_REQUIRED = ("trace_id", "region", "model", "start_ns", "end_ns", "e2e_s")


def parse_batch(value: str | bytes) -> list[dict[str, Any]]:
    """The records of one ``infersight.requests`` message: a JSON array of records (one object is read
    as a batch of one)."""
    import orjson  # the pipeline extra's; the instrumentation alone never reads batches

    parsed = orjson.loads(value)
    return parsed if isinstance(parsed, list) else [parsed]


def dump_batch(records: list[dict[str, Any]]) -> str:
    """One ``infersight.requests`` message: the records as a JSON array (what ``parse_batch`` reads)."""
    import orjson

    return orjson.dumps(records).decode()


def unique_requests(records: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each request once. A request delivered twice upstream (a gateway re-sending a batch after a
    restart: the pod-to-Kafka leg is at least once) becomes identical records with the same trace and
    span id; only the first is kept. Records without a span id (older producers) are all kept."""
    seen: set[tuple[str, str]] = set()
    for record in records:
        span_id = record.get("span_id")
        if span_id:
            identity = (record.get("trace_id"), span_id)
            if identity in seen:
                continue
            seen.add(identity)
        yield record


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_hex_id(value: Any, digits: int) -> bool:
    """A W3C trace or span id: ``digits`` lowercase hex digits, not all zero."""
    return (isinstance(value, str) and len(value) == digits and all(c in "0123456789abcdef" for c in value)
            and value != "0" * digits)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(record: RequestRecord | dict[str, Any]) -> list[str]:
    """Contract violations of one record (empty when valid); each message starts with the field name. Never
    raises: an item of a batch that is not an object is one problem."""
    if isinstance(record, RequestRecord):
        data = record.to_dict()
    elif isinstance(record, dict):
        data = dict(record)
    else:
        return [f"record: not a JSON object, got {type(record).__name__}"]
    problems: list[str] = []
    for name in _REQUIRED:
        if data.get(name) is None:
            problems.append(f"{name}: missing")
    for name in sorted(set(data) - set(RECORD_FIELDS)):
        problems.append(f"{name}: not a field of the request record")

    trace_id = data.get("trace_id")
    if trace_id is not None and not _is_hex_id(trace_id, 32):
        problems.append(f"trace_id: {trace_id!r} is not 32 lowercase hex digits (non-zero)")
    span_id = data.get("span_id", "")
    if span_id != "" and not _is_hex_id(span_id, 16):
        problems.append(f"span_id: {span_id!r} is neither empty nor 16 lowercase hex digits (non-zero)")
    for name in ("region", "model"):
        value = data.get(name)
        if value is not None and not (isinstance(value, str) and value):
            problems.append(f"{name}: must be a non-empty string, got {value!r}")
    for name in ("model_version", "engine"):
        value = data.get(name, "")
        if not isinstance(value, str):
            problems.append(f"{name}: must be a string, got {value!r}")
    track = data.get("track", "stable")
    if track not in TRACKS:
        problems.append(f"track: {track!r} is not one of {', '.join(TRACKS)}")
    for name in ("start_ns", "end_ns"):
        value = data.get(name)
        if value is not None and not (_is_int(value) and 0 < value <= INT64_MAX):
            problems.append(f"{name}: must be a positive 64-bit integer of nanoseconds, got {value!r}")
    start, end = data.get("start_ns"), data.get("end_ns")
    if _is_int(start) and _is_int(end) and end < start:
        problems.append(f"end_ns: {end} is before start_ns {start}")

    for name in DURATION_FIELDS:
        value = data.get(name)
        if value is None:
            continue
        if not _is_number(value):
            problems.append(f"{name}: must be a finite number of seconds, got {value!r}")
        elif value < 0:
            problems.append(f"{name}: negative duration {value}")
    for name in COUNT_FIELDS:
        value = data.get(name, 0)
        if not _is_int(value) or not 0 <= value <= INT64_MAX:
            problems.append(f"{name}: must be a non-negative 64-bit integer, got {value!r}")
    if problems:
        return problems  # the cross-field checks below assume well-typed fields

    e2e = data["e2e_s"]
    if e2e > (end - start) / NS + SLACK_S:
        problems.append(f"e2e_s: {e2e} exceeds end_ns - start_ns")
    for name in ("ttft_s", "queue_s", "prefill_s", "decode_s"):
        value = data.get(name)
        if value is not None and value > e2e + SLACK_S:
            problems.append(f"{name}: {value} exceeds e2e_s {e2e}")
    itl = [data.get(n) for n in ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s")]
    present = [v for v in itl if v is not None]
    if present != sorted(present):
        problems.append("itl_p50_s: percentiles must satisfy p50 <= p90 <= p99 <= max")
    if data.get("itl_count", 0) > 0 and data.get("itl_mean_s") is None:
        problems.append("itl_mean_s: missing although itl_count > 0")
    if data.get("tokens_cached", 0) > data.get("tokens_in", 0):
        problems.append("tokens_cached: more cached tokens than input tokens")
    if data.get("tokens_out", 0) > 0 and data.get("ttft_s") is None:
        problems.append("ttft_s: missing although tokens_out > 0")
    finish, error = data.get("finish_reason"), data.get("error_type")
    if finish is None and error is None:
        problems.append("finish_reason: missing (and no error_type)")
    elif finish is not None and finish not in FINISH_REASONS:
        problems.append(f"finish_reason: {finish!r} is not one of {', '.join(FINISH_REASONS)}")
    if error is not None and not (isinstance(error, str) and error):
        problems.append(f"error_type: must be a non-empty string, got {error!r}")
    return problems


_INF = float("inf")
_ZERO_TRACE_ID, _ZERO_SPAN_ID = "0" * 32, "0" * 16


def surely_valid(r: dict[str, Any]) -> bool:
    """A fast pre-check for a decoder's hot path: True only when ``validate(r)`` would find nothing, for a
    record dict whose times are set and ordered, region a short string, model a string or None, ids lowercase
    hex and keys exactly ``RECORD_FIELDS`` (what a span decoder guarantees by construction). A seventh of
    ``validate``'s cost; ``validate`` stays the judge: what this does not accept goes to it, and it words
    the problems. ``tests/unit/test_schemas_records.py`` checks it never accepts what ``validate`` rejects."""
    e2e = r["e2e_s"]
    if (type(e2e) is not float or not 0.0 <= e2e <= (r["end_ns"] - r["start_ns"]) / NS + SLACK_S
            or len(r["trace_id"]) != 32 or r["trace_id"] == _ZERO_TRACE_ID
            or not r["model"] or r["track"] not in TRACKS or r["finish_reason"] not in FINISH_REASONS):
        return False
    span_id = r["span_id"]
    if span_id and (len(span_id) != 16 or span_id == _ZERO_SPAN_ID):
        return False
    limit = e2e + SLACK_S
    for name in ("ttft_s", "queue_s", "prefill_s", "decode_s"):
        value = r[name]
        if value is not None and not (type(value) is float and 0.0 <= value <= limit):
            return False
    low = 0.0  # itl percentiles: each finite, non-negative, and none below the one before
    for name in ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s"):
        value = r[name]
        if value is not None:
            if not (type(value) is float and low <= value < _INF):
                return False
            low = value
    mean, count, tokens_in, tokens_out, cached = (r["itl_mean_s"], r["itl_count"], r["tokens_in"],
                                                  r["tokens_out"], r["tokens_cached"])
    if mean is not None and not (type(mean) is float and 0.0 <= mean < _INF):
        return False
    if not (type(count) is int and type(tokens_in) is int and type(tokens_out) is int and type(cached) is int
            and count >= 0 and tokens_out >= 0 and 0 <= cached <= tokens_in):
        return False
    if (count > 0 and mean is None) or (tokens_out > 0 and r["ttft_s"] is None):
        return False
    error = r["error_type"]
    return error is None or (type(error) is str and error != "")


_FIELD_SET = frozenset(RECORD_FIELDS)
_HEX32 = re.compile("[0-9a-f]{32}").fullmatch
_HEX16 = re.compile("(?:[0-9a-f]{16})?").fullmatch


def record_problems(item: Any) -> list[str]:
    """``validate`` for an item of a batch read from Kafka, fast for the common case: a record as the
    normaliser writes it (every field, well-typed) goes through ``surely_valid``; anything else is
    judged by ``validate``. Never raises. What the jobs run on every record before keying it."""
    if (type(item) is dict and len(item) == len(RECORD_FIELDS) and item.keys() == _FIELD_SET
            and type(item["region"]) is str and item["region"] and type(item["model"]) is str
            and type(item["model_version"]) is str and type(item["engine"]) is str
            and type(item["trace_id"]) is str and _HEX32(item["trace_id"]) is not None
            and type(item["span_id"]) is str and _HEX16(item["span_id"]) is not None
            and type(item["tokens_in"]) is int and type(item["tokens_out"]) is int and type(item["itl_count"]) is int
            and item["tokens_in"] <= INT64_MAX and item["tokens_out"] <= INT64_MAX and item["itl_count"] <= INT64_MAX
            and type(item["start_ns"]) is int and type(item["end_ns"]) is int
            and 0 < item["start_ns"] <= item["end_ns"] <= INT64_MAX):
        try:
            if surely_valid(item):
                return []
        except Exception:  # noqa: BLE001 - validate judges what the fast path cannot
            pass
    return validate(item)


GAUGE_FIELDS = ("region", "pod", "metric", "value", "time_ns")  # what the pod roll-up reads (more are fine)


def gauge_problems(item: Any, metrics: Container[str] = ()) -> list[str]:
    """Contract violations of one pod gauge point of an ``infersight.pods`` batch (empty when valid): an object
    with a non-empty ``region``, a string ``pod``, a ``metric`` (one of ``metrics`` when given), a finite
    ``value``, a positive 64-bit ``time_ns``, optional string ``model``/``model_version``/``track``/``gpu_type``
    and integer ``gpu_count``. Never raises."""
    if type(item) is not dict:
        return [f"gauge: not a JSON object, got {type(item).__name__}"]
    problems = []
    region = item.get("region")
    if not (isinstance(region, str) and region):
        problems.append(f"region: must be a non-empty string, got {region!r}")
    if not isinstance(item.get("pod"), str):
        problems.append(f"pod: must be a string, got {item.get('pod')!r}")
    metric = item.get("metric")
    if not isinstance(metric, str) or (metrics and metric not in metrics):
        problems.append(f"metric: not a pod gauge: {metric!r}")
    if not _is_number(item.get("value")):
        problems.append(f"value: must be a finite number, got {item.get('value')!r}")
    time_ns = item.get("time_ns")
    if not (_is_int(time_ns) and 0 < time_ns <= INT64_MAX):
        problems.append(f"time_ns: must be a positive 64-bit integer of nanoseconds, got {time_ns!r}")
    for name in ("model", "model_version", "track", "gpu_type"):
        if not isinstance(item.get(name, ""), str | None):
            problems.append(f"{name}: must be a string, got {item.get(name)!r}")
    count = item.get("gpu_count", 0)
    if count is not None and not (_is_int(count) and 0 <= count <= 1 << 20):
        problems.append(f"gpu_count: must be a small non-negative integer, got {count!r}")
    return problems
