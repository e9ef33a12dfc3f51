"""A finished request's figures, computed once (``summarise``), and what is built from them: the root
span's attributes and the per-request record.

``summarise`` is a pure function of what a request captured (``request.RequestContext``); the
instrumentation (``api.Instrumentation``) emits metrics, spans and the record from its ``RequestSummary``.
Attribute names come from the contract's table (``infersight.schemas.contract``), resolved into module
constants at import: nothing is looked up per request.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import sub
from typing import Any, NamedTuple, Protocol

from infersight.schemas import attributes as A
from infersight.schemas.contract import BY_NAME, ITL_FIELDS
from infersight.schemas.records import FINISH_REASONS, RequestRecord
from infersight.schemas.units import NS

_NS_F = float(NS)  # seconds = ns / 1e9: a float divisor is the cheaper division on the per-request path


class ItlSummary(NamedTuple):
    """The inter-token gaps of a request, summarised (nearest-rank percentiles, seconds). A tuple, not a
    frozen dataclass: built once per request, and frozen dataclasses construct slowly."""

    count: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float


# tuple.__new__ bound to the class: builds one without the namedtuple's Python-level __new__ (a frame less)
_new_itl = functools.partial(tuple.__new__, ItlSummary)


@functools.lru_cache(maxsize=4096)
def _ranks(n: int) -> tuple[int, int, int]:
    """Indexes of the nearest-rank p50, p90, p99 among ``n`` sorted values (observed values, never
    interpolated)."""
    return tuple(max(0, math.ceil(q * n) - 1) for q in (0.5, 0.9, 0.99))  # type: ignore[return-value]


def itl_summary(token_times_ns: list[int]) -> ItlSummary | None:
    """Summary of the gaps between consecutive token marks (sorted ascending), None with < 2 marks."""
    if len(token_times_ns) < 2:
        return None
    gaps = sorted(map(sub, token_times_ns[1:], token_times_ns))
    n = len(gaps)
    i50, i90, i99 = _ranks(n)
    return _new_itl((n, (token_times_ns[-1] - token_times_ns[0]) / n / _NS_F, gaps[i50] / _NS_F,
                     gaps[i90] / _NS_F, gaps[i99] / _NS_F, gaps[-1] / _NS_F))


@dataclass(slots=True)
class RequestSummary:
    """A finished request: what it was, its figures (seconds) and its outcome. Built once, at finish."""

    model: str
    operation: str
    start_ns: int  # wall clock (Unix ns)
    end_ns: int  # wall clock (Unix ns)
    e2e_s: float
    ttft_s: float | None
    tpot_s: float | None  # mean time per output token after the first
    queue_s: float | None  # the stage sums a record carries (routing and safety: spans only)
    prefill_s: float | None
    decode_s: float | None  # the decode stages, else first to last token
    itl: ItlSummary | None
    tokens_in: int | None
    tokens_out: int
    tokens_cached: int
    prefix_queried: int  # prompt tokens looked up in the prefix cache
    finish_reason: str
    error_type: str | None
    response_model: str | None
    response_id: str | None


class StageTimes(Protocol):
    """What ``summarise`` reads of a stage: its name and its (closed) span in the request's clock."""

    name: str
    start_ns: int
    end_ns: int


def summarise(model: str, operation: str, start: int, end: int, wall_offset: int, token_times: list[int],
              stages: Sequence[StageTimes], tokens_in: int | None, tokens_out: int | None, tokens_cached: int,
              prefix_queried: int, finish_reason: str, error_type: str | None, response_model: str | None,
              response_id: str | None) -> RequestSummary:
    """A request's summary from what it captured: ``start``/``end``, the token marks (first token first) and
    the stages (all closed, none before ``start``), in its own clock (ns); ``wall_offset`` turns that clock
    into wall-clock ns. ``tokens_out`` defaults to the number of marks."""
    queue = prefill = decode = None
    for stage in stages:
        name = stage.name
        if name == "decode":
            decode = (stage.end_ns - stage.start_ns) / _NS_F + (decode or 0.0)
        elif name == "queue":
            queue = (stage.end_ns - stage.start_ns) / _NS_F + (queue or 0.0)
        elif name == "prefill":
            prefill = (stage.end_ns - stage.start_ns) / _NS_F + (prefill or 0.0)
    n = len(token_times)
    if n:
        first = token_times[0]
        ttft = (first - start) / _NS_F
        if n >= 2:
            tpot = (token_times[-1] - first) / (n - 1) / _NS_F
            if decode is None:
                decode = (token_times[-1] - first) / _NS_F
            itl = itl_summary(token_times)
        else:
            tpot = itl = None
    else:
        ttft = tpot = itl = None
    return RequestSummary(model, operation, start + wall_offset, end + wall_offset, (end - start) / _NS_F, ttft,
                          tpot, queue, prefill, decode, itl, tokens_in, n if tokens_out is None else tokens_out,
                          tokens_cached, prefix_queried, finish_reason, error_type, response_model, response_id)


def _attribute(record_field: str) -> str:
    """The root span attribute of a record field (the contract's table)."""
    attribute = BY_NAME[record_field].attribute
    assert attribute is not None, record_field
    return attribute


# the root span's attribute names, from the contract's table (resolved once, here)
_MODEL, _FINISH_REASONS, _ERROR_TYPE = _attribute("model"), _attribute("finish_reason"), _attribute("error_type")
_E2E, _TTFT, _QUEUE = _attribute("e2e_s"), _attribute("ttft_s"), _attribute("queue_s")
_PREFILL, _DECODE = _attribute("prefill_s"), _attribute("decode_s")
_TOKENS_IN, _TOKENS_OUT = _attribute("tokens_in"), _attribute("tokens_out")
_TOKENS_CACHED = _attribute("tokens_cached")
_ITL_COUNT, _ITL_MEAN, _ITL_P50, _ITL_P90, _ITL_P99, _ITL_MAX = (_attribute(f.name) for f in ITL_FIELDS)
if tuple(f.name for f in ITL_FIELDS) != tuple(f"itl_{name}" for name in ItlSummary._fields):
    raise ImportError("ItlSummary's fields are not the contract's ITL_FIELDS, in order")

# one shared tuple per reason: a fresh one per request would keep the garbage collector tracking the
# record's attribute dict (all its other values are atomic) while the span waits in the export queue
_REASONS = {reason: (reason,) for reason in FINISH_REASONS}


def root_attributes(s: RequestSummary, base: dict[str, Any], content: dict[str, str] | None) -> dict[str, Any]:
    """The root span's attributes (also the record-only span's, so built for every request): ``base`` (the
    instrumentation's own: provider, engine, track, model version), the summary's, and captured content."""
    attrs = base.copy()
    attrs[A.GEN_AI_OPERATION_NAME] = s.operation
    attrs[_MODEL] = s.model
    reason = s.finish_reason
    attrs[_FINISH_REASONS] = _REASONS.get(reason) or (reason,)
    attrs[_E2E] = s.e2e_s
    if s.response_model is not None:
        attrs[A.GEN_AI_RESPONSE_MODEL] = s.response_model
    if s.response_id is not None:
        attrs[A.GEN_AI_RESPONSE_ID] = s.response_id
    if s.error_type is not None:
        attrs[_ERROR_TYPE] = s.error_type
    if (value := s.ttft_s) is not None:  # the optional figures, unrolled (every request)
        attrs[_TTFT] = value
    if (value := s.tpot_s) is not None:
        attrs[A.TPOT] = value  # not a record field: the record's consumers derive it
    if (value := s.queue_s) is not None:
        attrs[_QUEUE] = value
    if (value := s.prefill_s) is not None:
        attrs[_PREFILL] = value
    if (value := s.decode_s) is not None:
        attrs[_DECODE] = value
    if (value := s.tokens_in) is not None:
        attrs[_TOKENS_IN] = value
    attrs[_TOKENS_OUT] = s.tokens_out
    if s.tokens_cached:
        attrs[_TOKENS_CACHED] = s.tokens_cached
    itl = s.itl
    if itl is not None:
        attrs[_ITL_COUNT], attrs[_ITL_MEAN], attrs[_ITL_P50], attrs[_ITL_P90], attrs[_ITL_P99], attrs[_ITL_MAX] = itl
    if content:
        attrs.update(content)
    return attrs


def build_record(s: RequestSummary, trace_id: str, span_id: str, region: str, model_version: str, track: str,
                 engine: str) -> RequestRecord:
    """The contract's per-request record of a finished request (ids as hex; the instrumentation's region,
    model version, track and engine)."""
    itl = s.itl
    return RequestRecord(
        trace_id=trace_id, span_id=span_id, region=region, model=s.model, start_ns=s.start_ns, end_ns=s.end_ns,
        e2e_s=s.e2e_s, model_version=model_version, track=track, engine=engine, ttft_s=s.ttft_s,
        queue_s=s.queue_s, prefill_s=s.prefill_s, decode_s=s.decode_s, itl_count=itl.count if itl else 0,
        itl_mean_s=itl.mean_s if itl else None, itl_p50_s=itl.p50_s if itl else None,
        itl_p90_s=itl.p90_s if itl else None, itl_p99_s=itl.p99_s if itl else None,
        itl_max_s=itl.max_s if itl else None, tokens_in=s.tokens_in or 0, tokens_out=s.tokens_out,
        tokens_cached=s.tokens_cached, finish_reason=s.finish_reason, error_type=s.error_type)
